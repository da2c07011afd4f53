//! What a model file is, told from its first bytes and, for a zip archive, the names of its records
//! and the start of its pickle. fact reads TorchScript only; a user who hands it a state dict, a
//! pickled module or a torch.export program is told what the file is, so the fix (trace the model)
//! makes sense. Pure: the bridge lists the records and reads the pickle.

/// The kinds of file users hand fact.
#[derive(Clone, Debug, PartialEq)]
pub enum ArchiveKind {
    TorchScript,
    /// `torch.export.save`: a .pt2 archive (models/*.json, or serialized_exported_program.json).
    ExportedProgram,
    /// `torch.save(model.state_dict())`: tensors by name.
    StateDict,
    /// `torch.save(obj)` of an object of a Python class (a whole nn.Module, typically).
    PickledObject {
        class: String,
    },
    /// `torch.save` of anything else (a dict of numbers, a list).
    Pickle,
    /// `torch.save(..., _use_new_zipfile_serialization=False)`: a bare pickle stream.
    LegacyPickle,
    /// A zip archive with none of the records above.
    OtherZip {
        records: Vec<String>,
    },
    NotZip,
    Empty,
}

impl ArchiveKind {
    /// What the file is, for a message that goes on with how to trace the model.
    pub fn describe(&self) -> String {
        match self {
            ArchiveKind::TorchScript => "a TorchScript module".into(),
            ArchiveKind::ExportedProgram => {
                "it is a torch.export ExportedProgram (.pt2), which has no TorchScript graph".into()
            }
            ArchiveKind::StateDict => {
                "it is a state dict saved with torch.save (tensors by name, no code): load it into \
                 the model with model.load_state_dict(torch.load(path)) first"
                    .into()
            }
            ArchiveKind::PickledObject { class } => {
                format!("it is a pickled {class} object saved with torch.save (Python classes, no TorchScript code)")
            }
            ArchiveKind::Pickle => {
                "it is a plain pickle saved with torch.save (data, no code)".into()
            }
            ArchiveKind::LegacyPickle => {
                "it is a pickle in torch.save's legacy (non-zip) format, no TorchScript code".into()
            }
            ArchiveKind::OtherZip { records } => {
                let some: Vec<&str> = records.iter().take(4).map(String::as_str).collect();
                format!("it is a zip archive without TorchScript's code/ and constants.pkl (it holds {})", some.join(", "))
            }
            ArchiveKind::NotZip => "it is not a zip archive, as TorchScript archives are".into(),
            ArchiveKind::Empty => "the file is empty".into(),
        }
    }
}

/// The kind told by the first bytes alone; None for a zip archive, whose records tell.
pub fn from_head(head: &[u8]) -> Option<ArchiveKind> {
    match head {
        [] => Some(ArchiveKind::Empty),
        [b'P', b'K', ..] => None,
        // Pickle protocol 2+ opens with PROTO; torch.save's legacy format starts with a pickled magic number.
        [0x80, 2..=5, ..] => Some(ArchiveKind::LegacyPickle),
        _ => Some(ArchiveKind::NotZip),
    }
}

/// The kind of a zip archive from its record names (without the archive's top folder); `pickle`
/// reads the start of data.pkl when the names leave it open.
pub fn from_records(records: &[String], pickle: impl FnOnce() -> Vec<u8>) -> ArchiveKind {
    let has = |name: &str| records.iter().any(|r| r == name);
    let under = |dir: &str| records.iter().any(|r| r.starts_with(dir));
    if has("constants.pkl") || under("code/") {
        ArchiveKind::TorchScript
    } else if has("archive_format") || under("models/") || has("serialized_exported_program.json") {
        ArchiveKind::ExportedProgram
    } else if has("data.pkl") {
        of_pickle(&pickle())
    } else {
        ArchiveKind::OtherZip {
            records: records.to_vec(),
        }
    }
}

/// What a torch.save pickle holds, from its first object: a class (GLOBAL or STACK_GLOBAL), an
/// OrderedDict or dict of tensors (a state dict), or anything else.
fn of_pickle(p: &[u8]) -> ArchiveKind {
    let holds_tensors = p.windows(16).any(|w| w == b"_rebuild_tensor_");
    let mut at = 0;
    if p.first() == Some(&0x80) {
        at = 2;
    }
    if p.get(at) == Some(&0x95) {
        at += 9;
    }
    let class = match p.get(at) {
        Some(b'c') => {
            let mut parts = p[at + 1..].splitn(3, |&b| b == b'\n');
            match (parts.next(), parts.next()) {
                (Some(m), Some(n)) => Some(format!(
                    "{}.{}",
                    String::from_utf8_lossy(m),
                    String::from_utf8_lossy(n)
                )),
                _ => None,
            }
        }
        Some(0x8c) => {
            let short = |at: usize| -> Option<(String, usize)> {
                let len = *p.get(at + 1)? as usize;
                let s = p.get(at + 2..at + 2 + len)?;
                Some((String::from_utf8_lossy(s).into_owned(), at + 2 + len))
            };
            short(at).and_then(|(m, next)| {
                let next = if p.get(next) == Some(&0x94) {
                    next + 1
                } else {
                    next
                };
                (p.get(next) == Some(&0x8c))
                    .then(|| short(next))
                    .flatten()
                    .map(|(n, _)| format!("{m}.{n}"))
            })
        }
        _ => None,
    };
    let dict = match class.as_deref() {
        Some("collections.OrderedDict") => true,
        Some(c) => {
            return ArchiveKind::PickledObject {
                class: c.to_string(),
            }
        }
        None => p.get(at) == Some(&b'}'),
    };
    if dict && holds_tensors {
        ArchiveKind::StateDict
    } else {
        ArchiveKind::Pickle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn record_names_tell_torchscript_from_exported_programs() {
        let ts = names(&[
            "data.pkl",
            "code/__torch__/m.py",
            "constants.pkl",
            "version",
        ]);
        assert_eq!(
            from_records(&ts, || panic!("no pickle read for TorchScript")),
            ArchiveKind::TorchScript
        );
        let pt2 = names(&[
            "data/weights/weight_0",
            "models/model.json",
            "archive_format",
            ".data/version",
        ]);
        assert_eq!(from_records(&pt2, Vec::new), ArchiveKind::ExportedProgram);
        assert!(matches!(
            from_records(&names(&["a.txt"]), Vec::new),
            ArchiveKind::OtherZip { .. }
        ));
    }

    #[test]
    fn pickles_tell_state_dicts_from_objects_and_plain_data() {
        let sd = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(X\x06\x00\x00\x00weightq\x02ctorch._utils\n_rebuild_tensor_v2\n";
        let dict_of_tensors =
            b"\x80\x02}q\x00(X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n";
        let module = b"\x80\x02ctorch.nn.modules.linear\nLinear\nq\x00)\x81q\x01}";
        let plain = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.";
        let proto4 = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x08__main__\x94\x8c\x05Model\x94\x93";
        let pkl = names(&["data.pkl", "version"]);
        assert_eq!(from_records(&pkl, || sd.to_vec()), ArchiveKind::StateDict);
        assert_eq!(
            from_records(&pkl, || dict_of_tensors.to_vec()),
            ArchiveKind::StateDict
        );
        assert_eq!(
            from_records(&pkl, || module.to_vec()),
            ArchiveKind::PickledObject {
                class: "torch.nn.modules.linear.Linear".into()
            }
        );
        assert_eq!(from_records(&pkl, || plain.to_vec()), ArchiveKind::Pickle);
        assert_eq!(
            from_records(&pkl, || proto4.to_vec()),
            ArchiveKind::PickledObject {
                class: "__main__.Model".into()
            }
        );
    }

    #[test]
    fn first_bytes_tell_legacy_pickles_and_garbage() {
        assert_eq!(from_head(b"PK\x03\x04"), None);
        assert_eq!(
            from_head(b"\x80\x02\x8a\x0a"),
            Some(ArchiveKind::LegacyPickle)
        );
        assert_eq!(from_head(b"not a"), Some(ArchiveKind::NotZip));
        assert_eq!(from_head(b""), Some(ArchiveKind::Empty));
    }
}
