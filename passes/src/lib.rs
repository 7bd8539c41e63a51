//! IR-to-IR passes (static shapes, KV-share folding, dtype legalization, cleanup), arriving with the
//! XLA-path issue. The crate exists so the workspace already shows the pipeline.
