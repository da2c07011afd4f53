//! Pattern rules: pure matchers from the graph IR to the subgraphs fact can replace. No rule
//! touches libtorch, the GPU or the disk. Each rule's module doc states its math.

pub mod gemm;

pub use gemm::{match_gemms, GemmLayout, GemmMatch, GemmOrigin, GemmProblem};
