//! Integration tests: one binary, so libtorch links once. Fixture models come from
//! tests/fixtures/make_models.py, run once per test run with the project venv's torch.

mod addnorm;
mod attention;
mod common;
mod compile;
mod conv;
mod conv_abi;
mod custom_ops;
mod errors;
mod export;
mod gemm_abi;
mod gemm_ep;
mod glu;
mod grn;
mod ingest;
mod kept_params;
mod layernorm;
mod layers;
mod layouts;
mod memo;
mod native_mha;
mod outputs;
mod padding;
mod patch;
mod phases;
mod plan;
mod rmsnorm;
mod rotary;
mod sccache;
mod siblings;
mod table_cli;
mod words;
mod zoo;
