//! A kernel call's shared arrays, carved out of its launch's one shared-memory region.
//!
//! Calls that run side by side in a launch run on blocks of their own, so a block only ever uses
//! one call's arrays: the launch declares one region as large as its largest call needs
//! (`launch_smem_bytes`; a static array, or beyond 48 KiB a dynamic one, `SharedRegion`) and each
//! call lays its arrays out from the region's start. Static arrays
//! declared in each call's device function would instead all be allocated in every block, the
//! launch's shared memory the sum of its calls'.

/// The name of the launch's region, a parameter of each call's device function that has arrays.
pub(crate) const REGION: &str = "smem";

/// The arrays of one call, laid out in order from the region's 16-byte aligned start, each at
/// its type's alignment or, for 128-bit loads, at 16 bytes.
#[derive(Default)]
pub(crate) struct SharedArrays(Vec<Array>);

struct Array {
    ty: &'static str,
    name: String,
    count: u64,
    align: u64,
}

impl SharedArrays {
    /// Declares `name` as `count` elements of the C type `ty`.
    pub fn array(&mut self, ty: &'static str, name: impl Into<String>, count: u64) {
        self.0.push(Array { ty, name: name.into(), count, align: element_bytes(ty) });
    }

    /// Declares `name` as `count` elements of `ty`, starting 16-byte aligned.
    pub fn aligned(&mut self, ty: &'static str, name: impl Into<String>, count: u64) {
        self.0.push(Array { ty, name: name.into(), count, align: 16 });
    }

    /// `other`'s arrays after these.
    pub fn append(&mut self, other: SharedArrays) {
        self.0.extend(other.0);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each array's offset, and the bytes from the region's start to the end of the last array.
    fn layout(&self) -> (Vec<u64>, u64) {
        let mut end = 0u64;
        let offsets = self
            .0
            .iter()
            .map(|a| {
                let offset = end.next_multiple_of(a.align);
                end = offset + a.count * element_bytes(a.ty);
                offset
            })
            .collect();
        (offsets, end)
    }

    pub fn bytes(&self) -> u64 {
        self.layout().1
    }

    /// The arrays as parameters of the function that uses them: `__restrict__`, since they do
    /// not overlap. The compiler cannot tell that of pointers into one region, and assumes a
    /// store to one array may change any other: an array read inside a loop storing to another
    /// (a norm's statistics, while a matvec stages its activations) was read, and what is computed
    /// from it recomputed, at every iteration.
    pub fn params(&self) -> Vec<String> {
        self.0.iter().map(|a| format!("{}* __restrict__ {}", a.ty, a.name)).collect()
    }

    /// The arguments for `params`: pointers into the region.
    pub fn args(&self) -> Vec<String> {
        self.0
            .iter()
            .zip(self.layout().0)
            .map(|(a, offset)| format!("reinterpret_cast<{}*>({REGION} + {offset})", a.ty))
            .collect()
    }
}

fn element_bytes(ty: &str) -> u64 {
    match ty {
        "bool" => 1,
        "u16" => 2,
        "float" | "int" => 4,
        other => unreachable!("a shared array of {other}"),
    }
}
