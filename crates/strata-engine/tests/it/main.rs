//! Integration tests of the engine against real RocksDB (`strata-rocks`), a real local
//! object-store directory and a real S3-compatible server (moto) on loopback; faults are
//! injected through the engine's seams (the warm store and the object store it is handed).

mod basics;
mod bucket;
mod changes;
mod corruption;
mod crash;
mod databases;
mod kinds;
mod layout;
mod live;
mod model;
mod parts;
mod prefetch;
mod pressure;
mod s3;
mod shared;
mod slots;
mod support;
mod vlog;
