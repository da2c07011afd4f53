//! fact: substitutes the hot subgraphs of TorchScript models with tuned CUTLASS kernels.
//! ARCHITECTURE.md maps the stages; each module below is one of them.

pub mod codegen;
pub mod graph;
pub mod nvcc;
pub mod rules;
pub mod space;
pub mod torch;
pub mod types;
