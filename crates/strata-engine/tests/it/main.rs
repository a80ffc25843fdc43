//! Integration tests of the engine against real RocksDB, a real local object-store
//! directory and a real S3-compatible server (moto) on loopback.

mod basics;
mod corruption;
mod crash;
mod make_fixture;
mod model;
mod prefetch;
mod s3;
mod support;
mod vlog;
