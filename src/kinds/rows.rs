//! A knob the row-per-group norm kernels share (RMSNorm's and LayerNorm's, each a thread group
//! holding one row in registers): the order in which a group issues its memory accesses.

use serde::{Deserialize, Serialize};

/// How a norm kernel's thread group reads its row: its name suffix, and the templates' `early` flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowReads {
    /// Each load's arithmetic and stores before the next; the norm's parameters read after the
    /// reductions, where they are first used.
    #[default]
    InTurn,
    /// Every load of the row and of the norm's parameters issues first (`_es`), so the
    /// parameters' latency hides under the row's instead of following the reductions; the
    /// operands, read once, stream past L1 and L2 (evict-first), so what the kernel writes keeps
    /// its place in L2 for the op that reads it next; an operand that is one run of rows finds
    /// its row without a 64-bit division.
    EarlyStreamed,
}

impl RowReads {
    pub const ALL: [RowReads; 2] = [RowReads::InTurn, RowReads::EarlyStreamed];

    pub fn is_in_turn(&self) -> bool {
        *self == RowReads::InTurn
    }

    /// The kernel name's part: nothing for the default, so the names before this knob stand.
    pub fn name_suffix(&self) -> &'static str {
        match self {
            RowReads::InTurn => "",
            RowReads::EarlyStreamed => "_es",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_reads_back_from_specs_written_before_the_knob_and_names_nothing() {
        #[derive(Deserialize, Serialize)]
        struct S {
            #[serde(default, skip_serializing_if = "RowReads::is_in_turn")]
            reads: RowReads,
        }
        let old: S = serde_json::from_str("{}").unwrap();
        assert_eq!(old.reads, RowReads::InTurn);
        assert_eq!(serde_json::to_string(&old).unwrap(), "{}");
        let e = S {
            reads: RowReads::EarlyStreamed,
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"reads":"early_streamed"}"#
        );
        let names: Vec<&str> = RowReads::ALL.iter().map(RowReads::name_suffix).collect();
        assert_eq!(names, ["", "_es"]);
    }
}
