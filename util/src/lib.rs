//! What several g4c crates share and none of them owns: files written atomically (checkpoints,
//! artifacts, cache entries) and a streaming safetensors writer (synthetic checkpoints, artifact
//! weights).

pub mod atomic;
pub mod safetensors_writer;
