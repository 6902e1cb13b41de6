//! Models of KMDF, ibbus and AL, written from their sources (file:line in each item).
pub mod ibbus;
pub mod kmdf;
pub mod world;
