//! End-to-end tests: the real `strata` binary, driven by the real `redis-cli`, raw sockets
//! and, for the differential test, a real `redis-server` beside it.

mod cli;
mod config;
mod differential;
mod protocol;
mod server;
mod support;
