//! Models built from rill ops.
//!
//! | model | file |
//! |---|---|
//! | BERT-family encoders and sentence embeddings ([`bert::Embedder`]) | `bert.rs` |
//!
//! Everything a model needs comes from its directory ([`crate::io::ModelDir`]): the
//! architecture from `config.json`, the weights from `model.safetensors`, the pooling and
//! normalisation from the sentence-transformers files. docs/MODELS.md shows the use.

pub mod bert;
