//! Protobuf at the wire level: walk a message's fields and rewrite a few of them, copying every
//! other byte as it came. Fields our generated types do not know (a newer istiod's) survive.

use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};

#[derive(Debug, Clone, thiserror::Error)]
#[error("malformed protobuf: {0}")]
pub struct WireError(pub String);

/// One field of a message: its number, wire type, where it lies in the message, and its value
/// (the payload of a length-delimited field, the encoded bytes of any other).
pub struct Field<'a> {
    pub number: u32,
    pub wire_type: WireType,
    pub value: &'a [u8],
    start: usize,
    end: usize,
}

impl Field<'_> {
    pub fn is_len(&self) -> bool {
        self.wire_type == WireType::LengthDelimited
    }

    /// The value of a varint field (a bool, an enum, an integer).
    pub fn varint(&self) -> Option<u64> {
        let mut buf = self.value;
        (self.wire_type == WireType::Varint)
            .then(|| decode_varint(&mut buf).ok())
            .flatten()
    }
}

/// The fields of `msg`, in order.
pub fn fields(msg: &[u8]) -> Fields<'_> {
    Fields { msg, pos: 0 }
}

pub struct Fields<'a> {
    msg: &'a [u8],
    pos: usize,
}

impl<'a> Fields<'a> {
    fn next_field(&mut self) -> Result<Field<'a>, WireError> {
        let start = self.pos;
        let mut rest = self.msg.get(start..).unwrap_or_default();
        let before = rest.len();
        let (number, wire_type) = decode_key(&mut rest).map_err(|e| WireError(e.to_string()))?;
        let value_len = match wire_type {
            WireType::Varint => {
                let mut probe = rest;
                decode_varint(&mut probe).map_err(|e| WireError(e.to_string()))?;
                rest.len() - probe.len()
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let len = decode_varint(&mut rest).map_err(|e| WireError(e.to_string()))?;
                usize::try_from(len).map_err(|_| WireError(format!("length {len}")))?
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(WireError(format!(
                    "field {number}: groups are not used by xDS"
                )));
            }
        };
        let value_start = start + (before - rest.len());
        let end = value_start
            .checked_add(value_len)
            .filter(|end| *end <= self.msg.len())
            .ok_or_else(|| WireError(format!("field {number} runs past the message")))?;
        let value = self
            .msg
            .get(value_start..end)
            .ok_or_else(|| WireError(format!("field {number} runs past the message")))?;
        self.pos = end;
        Ok(Field {
            number,
            wire_type,
            value,
            start,
            end,
        })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.msg.len() {
            return None;
        }
        let item = self.next_field();
        if item.is_err() {
            self.pos = self.msg.len();
        }
        Some(item)
    }
}

/// The last length-delimited field `number` of `msg` (the last one wins, as in protobuf).
pub fn len_field(msg: &[u8], number: u32) -> Result<Option<&[u8]>, WireError> {
    let mut found = None;
    for field in fields(msg) {
        let field = field?;
        if field.number == number && field.is_len() {
            found = Some(field.value);
        }
    }
    Ok(found)
}

/// The string field `number` of `msg` ("" when absent or not UTF-8).
pub fn string_field(msg: &[u8], number: u32) -> Result<&str, WireError> {
    Ok(len_field(msg, number)?
        .and_then(|b| std::str::from_utf8(b).ok())
        .unwrap_or_default())
}

/// The last varint field `number` of `msg` (a bool, an enum, an integer), `None` when absent.
pub fn varint_field(msg: &[u8], number: u32) -> Result<Option<u64>, WireError> {
    let mut found = None;
    for field in fields(msg) {
        let field = field?;
        if field.number == number
            && let Some(v) = field.varint()
        {
            found = Some(v);
        }
    }
    Ok(found)
}

/// Every length-delimited field `number` of `msg` (a repeated string or message).
pub fn repeated(msg: &[u8], number: u32) -> Result<Vec<&[u8]>, WireError> {
    let mut out = Vec::new();
    for field in fields(msg) {
        let field = field?;
        if field.number == number && field.is_len() {
            out.push(field.value);
        }
    }
    Ok(out)
}

/// Appends a length-delimited field.
pub fn put_len(out: &mut Vec<u8>, number: u32, payload: &[u8]) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// What to do with one field.
pub enum Edit {
    Keep,
    Drop,
    /// A new payload for this length-delimited field.
    Replace(Vec<u8>),
    /// In its place, length-delimited field `number` with this payload (a oneof's other case).
    Renumber(u32, Vec<u8>),
    /// In its place, several fields of its number (entries of a repeated field), in order.
    ReplaceMany(Vec<Vec<u8>>),
}

/// Rewrites `msg` field by field; `None` when every field was kept (the caller keeps `msg`).
pub fn rewrite(
    msg: &[u8],
    mut edit: impl FnMut(&Field<'_>) -> Result<Edit, WireError>,
) -> Result<Option<Vec<u8>>, WireError> {
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    for field in fields(msg) {
        let field = field?;
        let change = edit(&field)?;
        if matches!(change, Edit::Keep) {
            continue;
        }
        let out = out.get_or_insert_with(|| Vec::with_capacity(msg.len()));
        out.extend_from_slice(msg.get(copied..field.start).unwrap_or_default());
        match change {
            Edit::Replace(payload) => put_len(out, field.number, &payload),
            Edit::Renumber(number, payload) => put_len(out, number, &payload),
            Edit::ReplaceMany(payloads) => {
                for p in payloads {
                    put_len(out, field.number, &p);
                }
            }
            Edit::Keep | Edit::Drop => {}
        }
        copied = field.end;
    }
    if let Some(out) = &mut out {
        out.extend_from_slice(msg.get(copied..).unwrap_or_default());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use prost::Message;

    #[test]
    fn rewrite_keeps_untouched_fields_and_replaces_one() {
        let msg = TypedExtensionConfig {
            name: "a".into(),
            typed_config: Some(envoy_types::pb::google::protobuf::Any {
                type_url: "t".into(),
                value: vec![1, 2, 3],
            }),
        }
        .encode_to_vec();
        let unchanged = rewrite(&msg, |_| Ok(Edit::Keep)).unwrap();
        assert!(unchanged.is_none());
        let renamed = rewrite(&msg, |f| {
            Ok(if f.number == 1 {
                Edit::Replace(b"bb".to_vec())
            } else {
                Edit::Keep
            })
        })
        .unwrap()
        .unwrap();
        let decoded = TypedExtensionConfig::decode(renamed.as_slice()).unwrap();
        assert_eq!(decoded.name, "bb");
        assert_eq!(decoded.typed_config.unwrap().value, vec![1, 2, 3]);
        let dropped = rewrite(&msg, |f| {
            Ok(if f.number == 2 {
                Edit::Drop
            } else {
                Edit::Keep
            })
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            TypedExtensionConfig::decode(dropped.as_slice()).unwrap(),
            TypedExtensionConfig {
                name: "a".into(),
                typed_config: None
            }
        );
    }

    #[test]
    fn truncated_messages_are_errors_not_panics() {
        let msg = TypedExtensionConfig {
            name: "abcdef".into(),
            typed_config: None,
        }
        .encode_to_vec();
        for cut in 1..msg.len() {
            assert!(fields(&msg[..cut]).any(|f| f.is_err()), "cut at {cut}");
        }
        assert!(fields(&[0x0b]).any(|f| f.is_err()), "a group");
    }
}
