//! What several g4c crates share and none of them owns: files written atomically (checkpoints,
//! artifacts, cache entries), a streaming safetensors writer (synthetic checkpoints, artifact
//! weights), reading input files that must be regular files, paths from the environment, file locks,
//! and the limits on the sizes g4c accepts.

pub mod atomic;
pub mod env;
pub mod files;
pub mod limits;
pub mod lock;
pub mod memory;
pub mod safetensors_writer;
