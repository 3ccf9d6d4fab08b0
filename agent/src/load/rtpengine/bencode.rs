//! Bencode, the dictionary format of rtpengine's ng control protocol: byte
//! strings `4:ping`, integers `i42e`, lists `l…e` and dictionaries `d…e`
//! (keys are byte strings).
//!
//! [`encode`] writes dictionary keys in sorted order, as bencode asks;
//! [`decode`] takes them in any order, since rtpengine does not sort its
//! own. Decoding never panics and allocates at most what the input holds:
//! a length is checked against the bytes left before anything is copied,
//! and nesting deeper than [`MAX_DEPTH`] is refused, so a hostile datagram
//! costs time linear in its size.

#[cfg(test)]
mod tests;

/// The deepest nesting [`decode`] accepts. rtpengine's replies nest four
/// levels (`statistics` → `controlstatistics` → `proxies` → a proxy).
pub const MAX_DEPTH: usize = 32;

/// A bencoded value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `i…e`
    Int(i64),
    /// `N:…`: bytes, most often UTF-8 text.
    Bytes(Vec<u8>),
    /// `l…e`
    List(Vec<Value>),
    /// `d…e`: key and value pairs in the order they came.
    Dict(Vec<(Vec<u8>, Value)>),
}

impl Value {
    /// A byte string holding `text`.
    pub fn text(text: &str) -> Value {
        Value::Bytes(text.as_bytes().to_vec())
    }

    /// The value of `key` in a dictionary (the first, should a peer send
    /// a key twice); `None` for a missing key or a value that is not a
    /// dictionary.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(pairs) => pairs
                .iter()
                .find(|(k, _)| k.as_slice() == key.as_bytes())
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The byte string as UTF-8 text, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Bytes(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
}

/// Appends the encoding of `value` to `out`.
pub fn encode(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Int(n) => {
            out.push(b'i');
            out.extend_from_slice(n.to_string().as_bytes());
            out.push(b'e');
        }
        Value::Bytes(b) => encode_bytes(b, out),
        Value::List(items) => {
            out.push(b'l');
            for item in items {
                encode(item, out);
            }
            out.push(b'e');
        }
        Value::Dict(pairs) => {
            let mut sorted: Vec<&(Vec<u8>, Value)> = pairs.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            out.push(b'd');
            for (key, value) in sorted {
                encode_bytes(key, out);
                encode(value, out);
            }
            out.push(b'e');
        }
    }
}

fn encode_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(bytes.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(bytes);
}

/// Why [`decode`] refused its input: what was wrong, and at which byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bencode: {problem} at byte {offset}")]
pub struct DecodeError {
    /// The offset of the offending byte in the input.
    pub offset: usize,
    /// What is wrong there.
    pub problem: Problem,
}

/// What [`DecodeError`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// The input ends inside a value.
    #[error("input ends inside a value")]
    Truncated,
    /// A byte that starts no value (`i`, `l`, `d` or a digit).
    #[error("no value starts here")]
    Unexpected,
    /// An integer that is not `-?[1-9][0-9]*` or `0`, or does not fit 64 bits.
    #[error("bad integer")]
    BadInteger,
    /// A string length that is not a decimal number, or longer than the
    /// bytes left.
    #[error("bad string length")]
    BadLength,
    /// A dictionary key that is not a byte string.
    #[error("dictionary key is not a string")]
    KeyNotString,
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("nested more than {MAX_DEPTH} levels deep")]
    TooDeep,
    /// Bytes after the value.
    #[error("bytes after the value")]
    Trailing,
}

/// Decodes one value that spans all of `input`.
///
/// # Errors
/// [`DecodeError`] naming the first problem and where it is.
pub fn decode(input: &[u8]) -> Result<Value, DecodeError> {
    let mut reader = Reader { input, at: 0 };
    let value = reader.value(0)?;
    if reader.at != input.len() {
        return Err(reader.error(Problem::Trailing));
    }
    Ok(value)
}

struct Reader<'a> {
    input: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn error(&self, problem: Problem) -> DecodeError {
        DecodeError {
            offset: self.at,
            problem,
        }
    }

    fn peek(&self) -> Result<u8, DecodeError> {
        self.input
            .get(self.at)
            .copied()
            .ok_or_else(|| self.error(Problem::Truncated))
    }

    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(self.error(Problem::TooDeep));
        }
        match self.peek()? {
            b'i' => {
                self.at += 1;
                self.integer().map(Value::Int)
            }
            b'0'..=b'9' => self.bytes().map(Value::Bytes),
            b'l' => {
                self.at += 1;
                let mut items = Vec::new();
                while self.peek()? != b'e' {
                    items.push(self.value(depth + 1)?);
                }
                self.at += 1;
                Ok(Value::List(items))
            }
            b'd' => {
                self.at += 1;
                let mut pairs = Vec::new();
                while self.peek()? != b'e' {
                    if !self.peek()?.is_ascii_digit() {
                        return Err(self.error(Problem::KeyNotString));
                    }
                    let key = self.bytes()?;
                    let value = self.value(depth + 1)?;
                    pairs.push((key, value));
                }
                self.at += 1;
                Ok(Value::Dict(pairs))
            }
            _ => Err(self.error(Problem::Unexpected)),
        }
    }

    /// The digits of an integer up to its `e` (the `i` already read).
    fn integer(&mut self) -> Result<i64, DecodeError> {
        let start = self.at;
        let rest = &self.input[start..];
        let Some(len) = rest.iter().position(|&b| b == b'e') else {
            self.at = self.input.len();
            return Err(self.error(Problem::Truncated));
        };
        let text = &rest[..len];
        let digits = text.strip_prefix(b"-").unwrap_or(text);
        let canonical = match digits {
            [] => false,
            [b'0'] => text.len() == 1,
            [first, ..] => *first != b'0' && digits.iter().all(u8::is_ascii_digit),
        };
        let parsed = std::str::from_utf8(text)
            .ok()
            .filter(|_| canonical)
            .and_then(|t| t.parse::<i64>().ok());
        match parsed {
            Some(n) => {
                self.at = start + len + 1;
                Ok(n)
            }
            None => Err(self.error(Problem::BadInteger)),
        }
    }

    /// `N:` and N bytes.
    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let start = self.at;
        let rest = &self.input[start..];
        let Some(colon) = rest.iter().position(|&b| b == b':') else {
            self.at = self.input.len();
            return Err(self.error(Problem::Truncated));
        };
        let digits = &rest[..colon];
        let left = rest.len() - colon - 1;
        let len = std::str::from_utf8(digits)
            .ok()
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<usize>().ok())
            .filter(|&n| n <= left)
            .ok_or_else(|| self.error(Problem::BadLength))?;
        let body = start + colon + 1;
        self.at = body + len;
        Ok(self.input[body..body + len].to_vec())
    }
}
