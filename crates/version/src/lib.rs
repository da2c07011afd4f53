//! The commit the fact binary is built from (`fact --version`, and every record that asks it),
//! as `abc1234`, `abc1234-dirty` where the checkout's sources differ from it, or `unknown`
//! outside a git checkout. A crate of its own so that the script that reads it reruns on every
//! source edit without rebuilding fact's C++ bridge (fact's own build script).

/// The commit, as build.rs read it.
pub const COMMIT: &str = env!("FACT_COMMIT");
