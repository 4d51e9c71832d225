//! Wire format of the bootstrap service: length-prefixed binary frames over a Unix socket.
//!
//! Every frame is a little-endian `u32` body length followed by the body; the body's first
//! byte is the operation code. Requests (client to server):
//!
//! | op | name     | payload                                           |
//! |----|----------|---------------------------------------------------|
//! | 1  | hello    | `u32 version`, `u32 rank`, `u32 size`, 16-byte nonce, 32-byte MAC |
//! | 2  | put      | `u32 key_len`, key (UTF-8), value (rest of body)  |
//! | 3  | get      | key (UTF-8, rest of body)                         |
//! | 4  | fence    | nothing                                           |
//! | 5  | abort    | `i32 code`, message (UTF-8, rest of body)         |
//! | 6  | finalize | nothing                                           |
//! | 7  | clock    | nothing; the reply is a value: the server's `CLOCK_MONOTONIC` (`u64` ns) |
//! | 8  | spawn    | a [`SpawnRequest`] (see [`super::spawn`]); the reply is a value, the bridge's text, once `tmpirun` has started the processes |
//!
//! Replies (server to client): `0x80` ok (nothing), `0x81` value (the bytes), `0x82` error
//! (a UTF-8 message). Every request gets exactly one reply; `get` and `fence` replies are
//! held by the server until they can be answered.
//!
//! Before any frame, the server sends each new connection a challenge (24 bytes, not framed:
//! see [`crate::auth`], [`Purpose::Bootstrap`](crate::auth::Purpose::Bootstrap)).
//! The `hello` carries the answer, so the job's secret never travels: from `rank` on, its
//! body is the connector's answer of that scheme (rank, size, the client's nonce, and
//! `HMAC(secret, label | server's nonce | rank | size)`). The server's reply to a `hello`
//! it admits is a value: its own proof (32 bytes, the HMAC over the client's nonce), which
//! the client checks before it trusts anything the server says.
//!
//! Decoders never panic: a short body, a bad op code, a key that is empty, too long or not
//! UTF-8, or a length above the caps is an [`Error::Bootstrap`].

use super::spawn::SpawnRequest;
use crate::auth::{ANSWER_LEN, MAC_LEN, NONCE_LEN};
use crate::error::{Error, Result};

/// Protocol version sent in `hello`; the server refuses any other.
pub const VERSION: u32 = 3;
/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// Largest value, in bytes.
pub const MAX_VALUE_LEN: usize = 1 << 20;
/// Longest abort or error message, in bytes (longer ones are cut by the sender).
pub const MAX_MSG_LEN: usize = 4096;
/// Length of a whole `hello` frame (prefix included): the most a server reads from a
/// connection before it has checked the job secret.
pub const HELLO_FRAME_LEN: usize = 4 + 1 + 4 + ANSWER_LEN;
/// Largest frame body: a `put` of the longest key and the largest value.
pub const MAX_FRAME: usize = 1 + 4 + MAX_KEY_LEN + MAX_VALUE_LEN;

const OP_HELLO: u8 = 1;
const OP_PUT: u8 = 2;
const OP_GET: u8 = 3;
const OP_FENCE: u8 = 4;
const OP_ABORT: u8 = 5;
const OP_FINALIZE: u8 = 6;
const OP_CLOCK: u8 = 7;
const OP_SPAWN: u8 = 8;
const OP_OK: u8 = 0x80;
const OP_VALUE: u8 = 0x81;
const OP_ERR: u8 = 0x82;

/// A client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// First request of every connection: who the client is.
    Hello {
        /// Protocol version ([`VERSION`]).
        version: u32,
        /// The client's rank.
        rank: u32,
        /// The job size the client believes in.
        size: u32,
        /// The client's nonce, which the server's proof answers.
        nonce: [u8; NONCE_LEN],
        /// `HMAC(secret, ...)` over the server's challenge, `rank` and `size`
        /// ([`crate::auth::answer`]); checked before anything else in the frame is trusted.
        mac: [u8; MAC_LEN],
    },
    /// Store `value` under `key` (a later put of the same key replaces it).
    Put {
        /// Key.
        key: String,
        /// Value.
        value: Vec<u8>,
    },
    /// Fetch the value of `key`, waiting until some rank has put it.
    Get {
        /// Key.
        key: String,
    },
    /// Barrier of every rank of the job.
    Fence,
    /// End the whole job with `code`.
    Abort {
        /// Exit code asked for.
        code: i32,
        /// Why.
        message: String,
    },
    /// The client is done; the connection closes after the reply.
    Finalize,
    /// The server's clock (`CLOCK_MONOTONIC`, ns, as a value of 8 little-endian bytes), for
    /// tracing: ranks of other hosts align their clocks to it (see `tmpi-trace`'s `clock`).
    Clock,
    /// Start processes as a new job connected to the spawning communicator's ranks
    /// (`MPI_Comm_spawn`); the reply, once they are started, is the [`super::spawn::Bridge`]'s
    /// text.
    Spawn(SpawnRequest),
}

/// A server reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The request succeeded.
    Ok,
    /// The value of a `get`.
    Value(Vec<u8>),
    /// The request failed; why.
    Err(String),
}

fn malformed(what: impl Into<String>) -> Error {
    Error::Bootstrap(format!("malformed frame: {}", what.into()))
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Checks a key: non-empty, at most [`MAX_KEY_LEN`] bytes.
///
/// # Errors
/// [`Error::Bootstrap`] naming what is wrong.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::Bootstrap("empty key".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::Bootstrap(format!("key of {} bytes is longer than {MAX_KEY_LEN}", key.len())));
    }
    Ok(())
}

fn check_value(len: usize) -> Result<()> {
    if len > MAX_VALUE_LEN {
        return Err(Error::Bootstrap(format!("value of {len} bytes is larger than {MAX_VALUE_LEN}")));
    }
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    b.get(at..at + 4).and_then(|s| s.try_into().ok()).map(u32::from_le_bytes).ok_or_else(|| malformed("body too short"))
}

fn utf8(b: &[u8], what: &str) -> Result<String> {
    String::from_utf8(b.to_vec()).map_err(|_| malformed(format!("{what} is not UTF-8")))
}

/// Starts a frame in `out`: reserves the length and writes the op code.
fn begin(out: &mut Vec<u8>, op: u8) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(op);
    start
}

/// Fills in the length of the frame started at `start`.
fn end(out: &mut [u8], start: usize) {
    // Bodies are capped far below 4 GiB by the encoders' callers (checked before encoding).
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

impl Request {
    /// Appends this request as one frame (length prefix included) to `out`.
    ///
    /// # Errors
    /// A key or value above the caps (the abort message is cut instead).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        match self {
            Request::Hello { version, rank, size, nonce, mac } => {
                let s = begin(out, OP_HELLO);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&rank.to_le_bytes());
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(nonce);
                out.extend_from_slice(mac);
                end(out, s);
            }
            Request::Put { key, value } => {
                check_key(key)?;
                check_value(value.len())?;
                let s = begin(out, OP_PUT);
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(value);
                end(out, s);
            }
            Request::Get { key } => {
                check_key(key)?;
                let s = begin(out, OP_GET);
                out.extend_from_slice(key.as_bytes());
                end(out, s);
            }
            Request::Fence => {
                let s = begin(out, OP_FENCE);
                end(out, s);
            }
            Request::Abort { code, message } => {
                let s = begin(out, OP_ABORT);
                out.extend_from_slice(&code.to_le_bytes());
                out.extend_from_slice(truncate_utf8(message, MAX_MSG_LEN).as_bytes());
                end(out, s);
            }
            Request::Finalize => {
                let s = begin(out, OP_FINALIZE);
                end(out, s);
            }
            Request::Clock => {
                let s = begin(out, OP_CLOCK);
                end(out, s);
            }
            Request::Spawn(req) => {
                req.check()?;
                let s = begin(out, OP_SPAWN);
                req.encode(out);
                if out.len() - s - 4 > MAX_FRAME {
                    out.truncate(s);
                    return Err(Error::InvalidArgument(format!("spawn: the commands take more than {MAX_FRAME} bytes")));
                }
                end(out, s);
            }
        }
        Ok(())
    }

    /// Decodes a frame body (without its length prefix).
    ///
    /// # Errors
    /// [`Error::Bootstrap`] for any malformed body.
    pub fn decode(body: &[u8]) -> Result<Self> {
        let (&op, rest) = body.split_first().ok_or_else(|| malformed("empty body"))?;
        let exact = |n: usize| {
            if rest.len() == n {
                Ok(())
            } else {
                Err(malformed(format!("op {op}: body of {} bytes, expected {n}", rest.len())))
            }
        };
        match op {
            OP_HELLO => {
                exact(4 + ANSWER_LEN)?;
                let mut nonce = [0u8; NONCE_LEN];
                nonce.copy_from_slice(&rest[12..12 + NONCE_LEN]);
                let mut mac = [0u8; MAC_LEN];
                mac.copy_from_slice(&rest[12 + NONCE_LEN..]);
                Ok(Request::Hello { version: u32_at(rest, 0)?, rank: u32_at(rest, 4)?, size: u32_at(rest, 8)?, nonce, mac })
            }
            OP_PUT => {
                let klen = u32_at(rest, 0)? as usize;
                let kv = &rest[4..];
                if klen > kv.len() {
                    return Err(malformed("put: key length beyond the body"));
                }
                let key = utf8(&kv[..klen], "key")?;
                check_key(&key)?;
                check_value(kv.len() - klen)?;
                Ok(Request::Put { key, value: kv[klen..].to_vec() })
            }
            OP_GET => {
                let key = utf8(rest, "key")?;
                check_key(&key)?;
                Ok(Request::Get { key })
            }
            OP_FENCE => exact(0).map(|()| Request::Fence),
            OP_ABORT => {
                let code = u32_at(rest, 0)? as i32;
                let msg = &rest[4..];
                if msg.len() > MAX_MSG_LEN {
                    return Err(malformed("abort message too long"));
                }
                Ok(Request::Abort { code, message: String::from_utf8_lossy(msg).into_owned() })
            }
            OP_FINALIZE => exact(0).map(|()| Request::Finalize),
            OP_CLOCK => exact(0).map(|()| Request::Clock),
            OP_SPAWN => SpawnRequest::decode(rest).map(Request::Spawn),
            _ => Err(malformed(format!("unknown request op {op}"))),
        }
    }
}

impl Reply {
    /// Appends this reply as one frame to `out` (an error message is cut to [`MAX_MSG_LEN`]).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Ok => {
                let s = begin(out, OP_OK);
                end(out, s);
            }
            Reply::Value(v) => {
                let s = begin(out, OP_VALUE);
                out.extend_from_slice(v);
                end(out, s);
            }
            Reply::Err(m) => {
                let s = begin(out, OP_ERR);
                out.extend_from_slice(truncate_utf8(m, MAX_MSG_LEN).as_bytes());
                end(out, s);
            }
        }
    }

    /// Decodes a frame body (without its length prefix).
    ///
    /// # Errors
    /// [`Error::Bootstrap`] for any malformed body.
    pub fn decode(body: &[u8]) -> Result<Self> {
        let (&op, rest) = body.split_first().ok_or_else(|| malformed("empty body"))?;
        match op {
            OP_OK if rest.is_empty() => Ok(Reply::Ok),
            OP_OK => Err(malformed("ok reply with a body")),
            OP_VALUE => {
                check_value(rest.len())?;
                Ok(Reply::Value(rest.to_vec()))
            }
            OP_ERR => {
                if rest.len() > MAX_MSG_LEN {
                    return Err(malformed("error message too long"));
                }
                Ok(Reply::Err(String::from_utf8_lossy(rest).into_owned()))
            }
            _ => Err(malformed(format!("unknown reply op {op}"))),
        }
    }
}

/// Takes one complete frame off the front of `buf`, if there is one.
///
/// Returns the body (without the length prefix) and removes the frame from `buf`.
///
/// # Errors
/// A declared length of zero or above [`MAX_FRAME`] (the stream cannot be trusted after it).
pub fn take_frame(buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>> {
    let Some(len) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    check_frame_len(len)?;
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let body = buf[4..4 + len].to_vec();
    buf.drain(..4 + len);
    Ok(Some(body))
}

/// Checks a declared frame length.
///
/// # Errors
/// Zero or above [`MAX_FRAME`].
pub fn check_frame_len(len: usize) -> Result<()> {
    if len == 0 || len > MAX_FRAME {
        return Err(malformed(format!("frame length {len} outside 1..={MAX_FRAME}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(r: Request) {
        let mut out = Vec::new();
        r.encode(&mut out).unwrap();
        let body = take_frame(&mut out).unwrap().unwrap();
        assert!(out.is_empty());
        assert_eq!(Request::decode(&body).unwrap(), r);
    }

    #[test]
    fn requests_roundtrip() {
        roundtrip(Request::Hello { version: VERSION, rank: 3, size: 8, nonce: [0x5a; NONCE_LEN], mac: [0xa5; MAC_LEN] });
        roundtrip(Request::Put { key: "addr-3".into(), value: vec![1, 2, 3] });
        roundtrip(Request::Put { key: "k".into(), value: vec![] });
        roundtrip(Request::Get { key: "ключ".into() });
        roundtrip(Request::Fence);
        roundtrip(Request::Abort { code: -7, message: "bad".into() });
        roundtrip(Request::Finalize);
        roundtrip(Request::Clock);
    }

    #[test]
    fn replies_roundtrip() {
        for r in [Reply::Ok, Reply::Value(vec![9; 100]), Reply::Err("nope".into())] {
            let mut out = Vec::new();
            r.encode(&mut out);
            let body = take_frame(&mut out).unwrap().unwrap();
            assert_eq!(Reply::decode(&body).unwrap(), r);
        }
    }

    #[test]
    fn caps_are_enforced() {
        let mut out = Vec::new();
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert!(Request::Get { key: long.clone() }.encode(&mut out).is_err());
        assert!(Request::Put { key: "k".into(), value: vec![0; MAX_VALUE_LEN + 1] }.encode(&mut out).is_err());
        assert!(Request::Get { key: String::new() }.encode(&mut out).is_err());
        assert!(out.is_empty());
        // Hand-built oversized get is refused by the decoder too.
        let mut body = vec![OP_GET];
        body.extend_from_slice(long.as_bytes());
        assert!(Request::decode(&body).is_err());
        // A frame that declares more than MAX_FRAME.
        let mut buf = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        assert!(take_frame(&mut buf).is_err());
        let mut buf = 0u32.to_le_bytes().to_vec();
        assert!(take_frame(&mut buf).is_err());
        // Abort messages are cut, not refused.
        let mut out = Vec::new();
        let msg = "é".repeat(MAX_MSG_LEN);
        Request::Abort { code: 1, message: msg }.encode(&mut out).unwrap();
        let body = take_frame(&mut out).unwrap().unwrap();
        match Request::decode(&body).unwrap() {
            Request::Abort { message, .. } => assert_eq!(message.len(), MAX_MSG_LEN),
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for body in [
            &[][..],
            &[OP_HELLO, 1, 0, 0],
            &[OP_PUT, 9, 0, 0, 0, b'a'],
            &[OP_PUT, 1, 0],
            &[OP_PUT, 0, 0, 0, 0, 1],
            &[OP_GET, 0xff, 0xfe],
            &[OP_FENCE, 0],
            &[OP_ABORT, 1],
            &[OP_FINALIZE, 1],
            &[77],
        ] {
            assert!(Request::decode(body).is_err(), "{body:?} decoded");
        }
        for body in [&[][..], &[OP_OK, 1], &[5]] {
            assert!(Reply::decode(body).is_err(), "{body:?} decoded");
        }
    }

    #[test]
    fn partial_frames_wait_for_more() {
        let mut full = Vec::new();
        Request::Get { key: "abc".into() }.encode(&mut full).unwrap();
        Request::Fence.encode(&mut full).unwrap();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for b in full {
            buf.push(b);
            while let Some(body) = take_frame(&mut buf).unwrap() {
                got.push(Request::decode(&body).unwrap());
            }
        }
        assert_eq!(got, vec![Request::Get { key: "abc".into() }, Request::Fence]);
    }

    proptest! {
        #[test]
        fn decoders_never_panic(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Request::decode(&body);
            let _ = Reply::decode(&body);
            let mut buf = body.clone();
            let _ = take_frame(&mut buf);
        }

        #[test]
        fn put_roundtrips(key in "[a-z0-9/_-]{1,40}", value in proptest::collection::vec(any::<u8>(), 0..200)) {
            let r = Request::Put { key, value };
            let mut out = Vec::new();
            r.encode(&mut out).unwrap();
            let body = take_frame(&mut out).unwrap().unwrap();
            prop_assert_eq!(Request::decode(&body).unwrap(), r);
        }
    }
}
