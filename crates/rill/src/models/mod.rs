//! Models built from rill ops.
//!
//! | model | file |
//! |---|---|
//! | BERT-family encoders and sentence embeddings ([`bert::Embedder`]) | `bert.rs` |
//! | llama-family decoders from GGUF files and text generation ([`llama::Llama`], [`llama::Generator`]) | `llama.rs`, `generate.rs` |
//!
//! Everything a model needs comes from its files: for BERT its directory
//! ([`crate::io::ModelDir`]: the architecture from `config.json`, the weights from
//! `model.safetensors`, the pooling and normalisation from the sentence-transformers
//! files); for llama its GGUF file (architecture, tokenizer and weights). docs/MODELS.md
//! shows the use.

pub mod bert;
mod generate;
pub mod llama;
