//! What the binding's scenarios share: a peer on the simulated fabric.

pub mod peer;
