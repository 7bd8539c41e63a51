//! How much memory the process may still take: what the kernel says is available
//! (`MemAvailable`), less than any address-space limit (`ulimit -v`) or memory cgroup (a
//! container's limit) allows. For refusing, up front
//! and in one line, work whose size is known before it starts, where running out would abort.

/// Bytes the process may still allocate, as far as Linux says; `None` where it cannot tell.
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().strip_suffix("kB")?;
    let free = kib.trim().parse::<u64>().ok()? * 1024;
    Some(free.min(address_space_left().unwrap_or(u64::MAX)).min(cgroup_left().unwrap_or(u64::MAX)))
}

/// What the memory cgroup leaves under its limit, if one is set: cgroup v2's `memory.max` less
/// `memory.current`, or v1's `memory.limit_in_bytes` less `memory.usage_in_bytes`, each usage less
/// the inactive file cache the kernel reclaims before it fails an allocation (`inactive_file`, as
/// kubelet's working set counts it). Read where `/proc/self/cgroup` places the process, at each of
/// its ancestors, and, for a container (whose cgroup is the mount's root), at the root.
fn cgroup_left() -> Option<u64> {
    struct Files {
        dir: String,
        limit: &'static str,
        usage: &'static str,
        inactive: &'static str,
    }
    let v2 = |dir: String| Files { dir, limit: "memory.max", usage: "memory.current", inactive: "inactive_file" };
    let v1 = |dir: String| Files {
        dir,
        limit: "memory.limit_in_bytes",
        usage: "memory.usage_in_bytes",
        inactive: "total_inactive_file",
    };
    let mut places = Vec::new();
    for line in std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default().lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        // A limit set on an ancestor holds its descendants too (systemd sets it on the slice).
        let ancestors = std::path::Path::new(path.trim_start_matches('/')).ancestors();
        for dir in ancestors.map(|a| a.display().to_string()).filter(|a| !a.is_empty()) {
            if controllers.is_empty() {
                places.push(v2(format!("/sys/fs/cgroup/{dir}")));
            } else if controllers.split(',').any(|c| c == "memory") {
                places.push(v1(format!("/sys/fs/cgroup/memory/{dir}")));
            }
        }
    }
    places.push(v2("/sys/fs/cgroup".into()));
    places.push(v1("/sys/fs/cgroup/memory".into()));
    let read = |path: String| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok();
    let inactive = |f: &Files| -> u64 {
        let stat = std::fs::read_to_string(format!("{}/memory.stat", f.dir)).unwrap_or_default();
        let value = stat.lines().find_map(|l| l.strip_prefix(f.inactive)?.strip_prefix(' ')?.trim().parse().ok());
        value.unwrap_or(0)
    };
    // "max" (no limit) does not parse, and neither does a file that is not there.
    places
        .iter()
        .filter_map(|f| {
            let limit = read(format!("{}/{}", f.dir, f.limit))?;
            let used = read(format!("{}/{}", f.dir, f.usage))?.saturating_sub(inactive(f));
            Some(limit.saturating_sub(used))
        })
        .min()
}

/// What `RLIMIT_AS` leaves beyond the address space already mapped, if it is set.
fn address_space_left() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmSize:"))?.trim().strip_suffix("kB")?;
    let mapped = kib.trim().parse::<u64>().ok()? * 1024;
    Some(limit.rlim_cur.saturating_sub(mapped))
}

/// Bytes in the largest unit that keeps a number ≥ 1 (decimal: kB, MB, GB).
pub fn fmt_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..1_000 => format!("{bytes} B"),
        1_000..1_000_000 => format!("{:.1} kB", b / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", b / 1e6),
        _ => format!("{:.2} GB", b / 1e9),
    }
}
