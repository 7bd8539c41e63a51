//! Enums whose variants are words of the text form (`exp`, `gt`, `sliding`, `bf16`): one list gives
//! the variants, `ALL`, `name`, `Display` and `FromStr`, whose error names what the word was for and
//! lists the words it knows.

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident $what:literal { $($variant:ident = $text:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant),* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                $name::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| {
                    let known: Vec<&str> = $name::ALL.iter().map(|v| v.name()).collect();
                    format!("unknown {} `{s}` (expected one of {})", $what, known.join(", "))
                })
            }
        }
    };
}

pub(crate) use named_enum;
