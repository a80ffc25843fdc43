//! Vector sets' index, as Redis 8's vector sets keep one: vectors normalized for cosine
//! similarity and quantized ([`quant`]: 32-bit floats, 8-bit integers, or sign bits), in an
//! HNSW graph whose links run both ways so removals relink instead of leaving tombstones,
//! searched with an optional filter inside the walk ([`hnsw`]) whose expressions
//! ([`filter`]) read each element's JSON attributes. No I/O: the server keeps
//! a set's elements through the engine and builds the graph from them.

pub mod filter;
pub mod hnsw;
pub mod quant;
pub mod set;

pub use hnsw::{Hnsw, NodeId};
pub use quant::{normalize, Quant, Stored};
pub use set::{Query, Settings, VectorSet};
