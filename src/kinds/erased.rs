//! The values of a kind (its problems and kernel specs) behind one type each: `Problem` and
//! `Spec` hold any kind's value as a `Value`, which compares, hashes and serializes as the value
//! itself. Serializing goes through `Captured`, the exact sequence of serde calls the value made
//! (fields in their order, numbers in their own types), replayed into whatever serializer asks:
//! an erased problem or spec writes the same bytes its concrete type writes. Deserializing needs
//! the list of kinds, so it lives with the registry.

use serde::ser::{self, Serialize, Serializer};
use std::any::Any;
use std::fmt::{self, Debug};
use std::hash::{Hash, Hasher};

/// A kind's value, erased: compared, hashed and serialized as the concrete value.
pub trait Value: Any + Debug + Send + Sync {
    fn as_any(&self) -> &dyn Any;
    /// Whether `other` is a value of the same type, equal to this one.
    fn eq_value(&self, other: &dyn Any) -> bool;
    fn hash_value(&self, state: &mut dyn Hasher);
    /// The serde calls that serialize this value.
    fn capture(&self) -> Captured;
}

impl<T: Any + Debug + Send + Sync + PartialEq + Hash + Serialize> Value for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn eq_value(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>().is_some_and(|o| self == o)
    }
    fn hash_value(&self, mut state: &mut dyn Hasher) {
        self.hash(&mut state);
    }
    fn capture(&self) -> Captured {
        self.serialize(Capture)
            .expect("kind values serialize (no 128-bit integers, string map keys)")
    }
}

/// One value's serde form as its `Serialize` made it: every call with its names, so replaying it
/// into a serializer (`Captured: Serialize`) produces the value's own output.
#[derive(Clone, Debug, PartialEq)]
pub enum Captured {
    Bool(bool),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
    Char(char),
    Str(String),
    Bytes(Vec<u8>),
    None,
    Some(Box<Captured>),
    Unit,
    UnitStruct(&'static str),
    UnitVariant(&'static str, u32, &'static str),
    NewtypeStruct(&'static str, Box<Captured>),
    NewtypeVariant(&'static str, u32, &'static str, Box<Captured>),
    Seq(Vec<Captured>),
    Tuple(Vec<Captured>),
    TupleStruct(&'static str, Vec<Captured>),
    TupleVariant(&'static str, u32, &'static str, Vec<Captured>),
    Map(Vec<(Captured, Captured)>),
    Struct(&'static str, Vec<Field>),
    StructVariant(&'static str, u32, &'static str, Vec<Field>),
}

/// A struct's field as serialized: written, or skipped (`skip_serializing_if`).
#[derive(Clone, Debug, PartialEq)]
pub enum Field {
    Value(&'static str, Captured),
    Skipped(&'static str),
}

impl Serialize for Captured {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use ser::{
            SerializeMap, SerializeSeq, SerializeStruct, SerializeStructVariant, SerializeTuple,
            SerializeTupleStruct, SerializeTupleVariant,
        };
        match self {
            Captured::Bool(v) => s.serialize_bool(*v),
            Captured::I64(v) => s.serialize_i64(*v),
            Captured::U64(v) => s.serialize_u64(*v),
            Captured::F32(v) => s.serialize_f32(*v),
            Captured::F64(v) => s.serialize_f64(*v),
            Captured::Char(v) => s.serialize_char(*v),
            Captured::Str(v) => s.serialize_str(v),
            Captured::Bytes(v) => s.serialize_bytes(v),
            Captured::None => s.serialize_none(),
            Captured::Some(v) => s.serialize_some(v.as_ref()),
            Captured::Unit => s.serialize_unit(),
            Captured::UnitStruct(name) => s.serialize_unit_struct(name),
            Captured::UnitVariant(name, i, variant) => s.serialize_unit_variant(name, *i, variant),
            Captured::NewtypeStruct(name, v) => s.serialize_newtype_struct(name, v.as_ref()),
            Captured::NewtypeVariant(name, i, variant, v) => {
                s.serialize_newtype_variant(name, *i, variant, v.as_ref())
            }
            Captured::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Captured::Tuple(items) => {
                let mut t = s.serialize_tuple(items.len())?;
                for v in items {
                    t.serialize_element(v)?;
                }
                t.end()
            }
            Captured::TupleStruct(name, items) => {
                let mut t = s.serialize_tuple_struct(name, items.len())?;
                for v in items {
                    t.serialize_field(v)?;
                }
                t.end()
            }
            Captured::TupleVariant(name, i, variant, items) => {
                let mut t = s.serialize_tuple_variant(name, *i, variant, items.len())?;
                for v in items {
                    t.serialize_field(v)?;
                }
                t.end()
            }
            Captured::Map(entries) => {
                let mut m = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
            Captured::Struct(name, fields) => {
                let written = fields
                    .iter()
                    .filter(|f| matches!(f, Field::Value(..)))
                    .count();
                let mut st = s.serialize_struct(name, written)?;
                for f in fields {
                    match f {
                        Field::Value(key, v) => st.serialize_field(key, v)?,
                        Field::Skipped(key) => st.skip_field(key)?,
                    }
                }
                st.end()
            }
            Captured::StructVariant(name, i, variant, fields) => {
                let written = fields
                    .iter()
                    .filter(|f| matches!(f, Field::Value(..)))
                    .count();
                let mut st = s.serialize_struct_variant(name, *i, variant, written)?;
                for f in fields {
                    match f {
                        Field::Value(key, v) => st.serialize_field(key, v)?,
                        Field::Skipped(key) => st.skip_field(key)?,
                    }
                }
                st.end()
            }
        }
    }
}

/// Why a value could not be captured (a 128-bit integer, or a serializer's custom error).
#[derive(Debug)]
pub struct CaptureError(String);

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CaptureError {}

impl ser::Error for CaptureError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        CaptureError(msg.to_string())
    }
}

/// The serializer that records a value's serde calls as `Captured`.
struct Capture;

fn capture<T: Serialize + ?Sized>(v: &T) -> Result<Captured, CaptureError> {
    v.serialize(Capture)
}

/// A compound value being captured: its elements so far.
struct Elements {
    kind: Compound,
    items: Vec<Captured>,
}

enum Compound {
    Seq,
    Tuple,
    TupleStruct(&'static str),
    TupleVariant(&'static str, u32, &'static str),
}

struct Entries {
    entries: Vec<(Captured, Captured)>,
    key: Option<Captured>,
}

struct Fields {
    name: &'static str,
    variant: Option<(u32, &'static str)>,
    fields: Vec<Field>,
}

impl Serializer for Capture {
    type Ok = Captured;
    type Error = CaptureError;
    type SerializeSeq = Elements;
    type SerializeTuple = Elements;
    type SerializeTupleStruct = Elements;
    type SerializeTupleVariant = Elements;
    type SerializeMap = Entries;
    type SerializeStruct = Fields;
    type SerializeStructVariant = Fields;

    fn serialize_bool(self, v: bool) -> Result<Captured, CaptureError> {
        Ok(Captured::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Captured, CaptureError> {
        Ok(Captured::I64(v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<Captured, CaptureError> {
        Ok(Captured::I64(v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<Captured, CaptureError> {
        Ok(Captured::I64(v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<Captured, CaptureError> {
        Ok(Captured::I64(v))
    }
    fn serialize_u8(self, v: u8) -> Result<Captured, CaptureError> {
        Ok(Captured::U64(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<Captured, CaptureError> {
        Ok(Captured::U64(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<Captured, CaptureError> {
        Ok(Captured::U64(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<Captured, CaptureError> {
        Ok(Captured::U64(v))
    }
    fn serialize_f32(self, v: f32) -> Result<Captured, CaptureError> {
        Ok(Captured::F32(v))
    }
    fn serialize_f64(self, v: f64) -> Result<Captured, CaptureError> {
        Ok(Captured::F64(v))
    }
    fn serialize_char(self, v: char) -> Result<Captured, CaptureError> {
        Ok(Captured::Char(v))
    }
    fn serialize_str(self, v: &str) -> Result<Captured, CaptureError> {
        Ok(Captured::Str(v.to_string()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Captured, CaptureError> {
        Ok(Captured::Bytes(v.to_vec()))
    }
    fn serialize_none(self) -> Result<Captured, CaptureError> {
        Ok(Captured::None)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<Captured, CaptureError> {
        Ok(Captured::Some(Box::new(capture(v)?)))
    }
    fn serialize_unit(self) -> Result<Captured, CaptureError> {
        Ok(Captured::Unit)
    }
    fn serialize_unit_struct(self, name: &'static str) -> Result<Captured, CaptureError> {
        Ok(Captured::UnitStruct(name))
    }
    fn serialize_unit_variant(
        self,
        name: &'static str,
        i: u32,
        variant: &'static str,
    ) -> Result<Captured, CaptureError> {
        Ok(Captured::UnitVariant(name, i, variant))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        v: &T,
    ) -> Result<Captured, CaptureError> {
        Ok(Captured::NewtypeStruct(name, Box::new(capture(v)?)))
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        i: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<Captured, CaptureError> {
        Ok(Captured::NewtypeVariant(
            name,
            i,
            variant,
            Box::new(capture(v)?),
        ))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Elements, CaptureError> {
        Ok(Elements {
            kind: Compound::Seq,
            items: Vec::with_capacity(len.unwrap_or(0)),
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Elements, CaptureError> {
        Ok(Elements {
            kind: Compound::Tuple,
            items: Vec::with_capacity(len),
        })
    }
    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Elements, CaptureError> {
        Ok(Elements {
            kind: Compound::TupleStruct(name),
            items: Vec::with_capacity(len),
        })
    }
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Elements, CaptureError> {
        Ok(Elements {
            kind: Compound::TupleVariant(name, i, variant),
            items: Vec::with_capacity(len),
        })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Entries, CaptureError> {
        Ok(Entries {
            entries: Vec::new(),
            key: None,
        })
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Fields, CaptureError> {
        Ok(Fields {
            name,
            variant: None,
            fields: Vec::new(),
        })
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        i: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Fields, CaptureError> {
        Ok(Fields {
            name,
            variant: Some((i, variant)),
            fields: Vec::new(),
        })
    }
}

impl Elements {
    fn push<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CaptureError> {
        self.items.push(capture(v)?);
        Ok(())
    }
    fn done(self) -> Captured {
        match self.kind {
            Compound::Seq => Captured::Seq(self.items),
            Compound::Tuple => Captured::Tuple(self.items),
            Compound::TupleStruct(name) => Captured::TupleStruct(name, self.items),
            Compound::TupleVariant(name, i, variant) => {
                Captured::TupleVariant(name, i, variant, self.items)
            }
        }
    }
}

impl ser::SerializeSeq for Elements {
    type Ok = Captured;
    type Error = CaptureError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CaptureError> {
        self.push(v)
    }
    fn end(self) -> Result<Captured, CaptureError> {
        Ok(self.done())
    }
}

impl ser::SerializeTuple for Elements {
    type Ok = Captured;
    type Error = CaptureError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CaptureError> {
        self.push(v)
    }
    fn end(self) -> Result<Captured, CaptureError> {
        Ok(self.done())
    }
}

impl ser::SerializeTupleStruct for Elements {
    type Ok = Captured;
    type Error = CaptureError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CaptureError> {
        self.push(v)
    }
    fn end(self) -> Result<Captured, CaptureError> {
        Ok(self.done())
    }
}

impl ser::SerializeTupleVariant for Elements {
    type Ok = Captured;
    type Error = CaptureError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CaptureError> {
        self.push(v)
    }
    fn end(self) -> Result<Captured, CaptureError> {
        Ok(self.done())
    }
}

impl ser::SerializeMap for Entries {
    type Ok = Captured;
    type Error = CaptureError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), CaptureError> {
        self.key = Some(capture(k)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CaptureError> {
        let k = self
            .key
            .take()
            .ok_or_else(|| CaptureError("a map value without its key".into()))?;
        self.entries.push((k, capture(v)?));
        Ok(())
    }
    fn end(self) -> Result<Captured, CaptureError> {
        Ok(Captured::Map(self.entries))
    }
}

impl Fields {
    fn done(self) -> Captured {
        match self.variant {
            None => Captured::Struct(self.name, self.fields),
            Some((i, variant)) => Captured::StructVariant(self.name, i, variant, self.fields),
        }
    }
}

impl ser::SerializeStruct for Fields {
    type Ok = Captured;
    type Error = CaptureError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), CaptureError> {
        self.fields.push(Field::Value(key, capture(v)?));
        Ok(())
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), CaptureError> {
        self.fields.push(Field::Skipped(key));
        Ok(())
    }
    fn end(self) -> Result<Captured, CaptureError> {
        Ok(self.done())
    }
}

impl ser::SerializeStructVariant for Fields {
    type Ok = Captured;
    type Error = CaptureError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), CaptureError> {
        self.fields.push(Field::Value(key, capture(v)?));
        Ok(())
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), CaptureError> {
        self.fields.push(Field::Skipped(key));
        Ok(())
    }
    fn end(self) -> Result<Captured, CaptureError> {
        Ok(self.done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Debug, PartialEq, Hash, Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Shape {
        Plain,
        Tiled { m: u32, n: u32 },
        Named(String),
    }

    #[derive(Debug, PartialEq, Hash, Serialize)]
    struct Thing {
        zeta: i64,
        alpha: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<u8>,
        shapes: Vec<Shape>,
        scale: [u32; 3],
        text: String,
        flag: bool,
        ratio: OrderedF64,
    }

    /// An f64 that hashes by its bits, as a kind's values would (tests only).
    #[derive(Debug, PartialEq, Serialize)]
    struct OrderedF64(f64);

    impl Hash for OrderedF64 {
        fn hash<H: Hasher>(&self, h: &mut H) {
            self.0.to_bits().hash(h)
        }
    }

    #[test]
    fn a_captured_value_serializes_as_the_value_does() {
        let t = Thing {
            zeta: -3,
            alpha: None,
            skipped: None,
            shapes: vec![
                Shape::Plain,
                Shape::Tiled { m: 128, n: 256 },
                Shape::Named("x".into()),
            ],
            scale: [1, 2, 3],
            text: "a \"quoted\" line".into(),
            flag: true,
            ratio: OrderedF64(0.7978845608028654),
        };
        let erased: &dyn Value = &t;
        let c = erased.capture();
        for (own, replayed) in [
            (serde_json::to_string(&t), serde_json::to_string(&c)),
            (
                serde_json::to_string_pretty(&t),
                serde_json::to_string_pretty(&c),
            ),
        ] {
            assert_eq!(own.unwrap(), replayed.unwrap());
        }
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::to_value(&c).unwrap()
        );
        assert!(serde_json::to_string(&c)
            .unwrap()
            .starts_with("{\"zeta\":-3,\"alpha\":null,"));
        assert!(erased.eq_value(&t) && !erased.eq_value(&3u8));
    }
}
