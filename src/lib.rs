//! fact: substitutes the hot subgraphs of TorchScript models with tuned CUTLASS kernels.
//! ARCHITECTURE.md maps the stages; each module below is one of them.

pub mod agent;
pub mod atomic;
pub mod bench;
pub mod cli;
pub mod codegen;
pub mod compose;
pub mod graph;
pub mod kinds;
pub mod nvcc;
pub mod plan;
pub mod rules;
pub mod space;
pub mod table;
pub mod torch;
pub mod tune;
pub mod types;
