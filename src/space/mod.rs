//! What the sweeps of every kind share: the options of a sweep (`SpaceOptions`), the learned
//! validity rules that keep kernels known to fail out of later sweeps (validity.rs), and the
//! index of CUTLASS examples that ground the kernels (examples.rs). Each kind's own kernel specs
//! and candidates live in its folder (`crate::kinds`).

pub mod examples;
pub mod validity;

/// Options of the space derivation.
#[derive(Clone, Debug)]
pub struct SpaceOptions {
    /// Keep at most this many kernels (compile units) after ordering.
    pub budget: usize,
    /// Drop kernels estimated slower than this factor times the best estimate.
    pub hopeless: f64,
    /// Keep the best this many of each family and kernel schedule (within the hopeless cut)
    /// whatever their rank, so the estimate's rates for each are checked by measurement rather
    /// than trusted (the GPT block's GEMMs are won by ping-pong kernels the estimate ranks below
    /// cooperative ones at 4096³).
    pub per_group: usize,
}

impl Default for SpaceOptions {
    /// A budget of 12: in the GPT block's cold compose on the H100 every sweep's winner was among
    /// the estimate's best 6 (benches/results/e2e), and one nvcc unit costs most of a minute.
    fn default() -> Self {
        SpaceOptions {
            budget: 12,
            hopeless: 1.8,
            per_group: 2,
        }
    }
}
