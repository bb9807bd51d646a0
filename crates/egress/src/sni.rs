//! The server name (SNI) of a TLS ClientHello, read from the first bytes a
//! client sends through a tunnel, so that a tunnel opened to an allowed host
//! cannot ask a shared front end for another one.
//!
//! TLS lets a client cut its ClientHello into handshake records of any size
//! (RFC 8446, section 5.1), so the hello is reassembled from consecutive
//! handshake records before it is read: a name in a later record is seen as
//! surely as one in the first. Reassembly is bounded ([`MAX_HANDSHAKE`]
//! bytes, [`MAX_RECORDS`] records), and anything that is not a whole,
//! well-formed ClientHello is [`Unreadable`], which the proxy refuses.

/// TLS content type of handshake records.
pub const HANDSHAKE: u8 = 22;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Extension types read here (RFC 6066, and the ECH draft's).
const SERVER_NAME: u16 = 0;
const ENCRYPTED_CLIENT_HELLO: u16 = 0xfe0d;
/// Bytes of a record header: type, version (2), length (2).
const RECORD_HEADER: usize = 5;
/// Bytes of a handshake message header: type, length (3).
const MESSAGE_HEADER: usize = 4;

/// Largest ClientHello read, its handshake header included. Real hellos,
/// post-quantum key shares included, take 2 KiB or less; 16 KiB is the
/// most one record may carry, so a single-record hello always fits.
pub const MAX_HANDSHAKE: usize = 16 * 1024;
/// Most records a ClientHello may span. Clients send it in one record (two
/// when it exceeds a record); more is a client trying to hide its name.
pub const MAX_RECORDS: usize = 16;
/// Bytes buffered at most while [`client_hello`] asks for more: every byte
/// it has seen belongs to a record within the two bounds above.
pub const MAX_BUFFERED: usize = MAX_HANDSHAKE + MAX_RECORDS * RECORD_HEADER;

/// A well-formed ClientHello, by the server name it asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// No `server_name` extension (clients leave it out for an address).
    NoName,
    /// The host name asked for, lower-cased.
    Name(String),
}

/// Why the start of a tunnel is not a ClientHello whose name can be read.
/// The texts follow "the tunnel to HOST ".
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("did not start with a TLS handshake record")]
    NotHandshake,
    #[error("sent a TLS record of version {0}.x, not 3.x")]
    Version(u8),
    #[error("did not start its TLS handshake with a ClientHello")]
    NotClientHello,
    #[error("sent a TLS ClientHello of more than {MAX_HANDSHAKE} bytes")]
    TooLarge,
    #[error("cut its TLS ClientHello into more than {MAX_RECORDS} records")]
    TooManyRecords,
    #[error("sent a TLS ClientHello that does not parse")]
    Malformed,
    /// Its real server name is encrypted (ECH), so it cannot be checked.
    #[error("sent an encrypted TLS ClientHello, whose server name cannot be checked")]
    Encrypted,
}

/// Reads the ClientHello that `buf`, the start of a tunnel, opens with:
/// `Ok(None)` while more bytes are needed (then `buf` holds at most
/// [`MAX_BUFFERED`] bytes). Bytes after the hello's last record (such as
/// early data) are not looked at; handshake bytes after the hello within
/// that record are malformed, as a client sends nothing else before the
/// server answers.
pub fn client_hello(buf: &[u8]) -> Result<Option<Hello>, Unreadable> {
    let mut fragments: Vec<&[u8]> = Vec::new();
    let mut gathered = 0;
    let mut at = 0;
    loop {
        let header = &buf[at..buf.len().min(at + RECORD_HEADER)];
        if header.is_empty() {
            return Ok(None);
        }
        if fragments.len() == MAX_RECORDS {
            return Err(Unreadable::TooManyRecords);
        }
        match header {
            [kind, ..] if *kind != HANDSHAKE => return Err(Unreadable::NotHandshake),
            [_, major, ..] if *major != 3 => return Err(Unreadable::Version(*major)),
            _ => {}
        }
        if header.len() < RECORD_HEADER {
            return Ok(None);
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        // Zero-length handshake fragments are forbidden (RFC 8446, 5.1).
        if len == 0 {
            return Err(Unreadable::Malformed);
        }
        if gathered + len > MAX_HANDSHAKE {
            return Err(Unreadable::TooLarge);
        }
        let Some(fragment) = buf.get(at + RECORD_HEADER..at + RECORD_HEADER + len) else {
            return Ok(None);
        };
        fragments.push(fragment);
        gathered += len;
        at += RECORD_HEADER + len;
        let mut head = fragments.iter().flat_map(|f| f.iter().copied()).take(MESSAGE_HEADER);
        let Some(kind) = head.next() else { continue };
        if kind != CLIENT_HELLO {
            return Err(Unreadable::NotClientHello);
        }
        let length: Vec<u8> = head.collect();
        let [a, b, c] = length[..] else { continue };
        let message = MESSAGE_HEADER + u32::from_be_bytes([0, a, b, c]) as usize;
        if message > MAX_HANDSHAKE {
            return Err(Unreadable::TooLarge);
        }
        if gathered >= message {
            if gathered > message {
                return Err(Unreadable::Malformed);
            }
            return parse(&fragments.concat()[MESSAGE_HEADER..]).map(Some);
        }
    }
}

/// Parses a ClientHello's body (RFC 8446, 4.1.2), strictly: a hello a
/// server would read differently from this parser is refused.
fn parse(body: &[u8]) -> Result<Hello, Unreadable> {
    let mut r = Reader(body);
    r.skip(2 + 32)?; // legacy version, random
    let session = r.u8()? as usize;
    r.skip(session)?;
    let suites = r.u16()? as usize;
    r.skip(suites)?;
    let compression = r.u8()? as usize;
    r.skip(compression)?;
    if r.0.is_empty() {
        return Ok(Hello::NoName); // a hello without extensions (TLS 1.2 and older)
    }
    let ext_len = r.u16()? as usize;
    let mut exts = Reader(r.take(ext_len)?);
    if !r.0.is_empty() {
        return Err(Unreadable::Malformed);
    }
    let mut name = None;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = exts.u16()? as usize;
        let body = exts.take(len)?;
        match kind {
            // A second one is refused by servers; here it could hide the name they read.
            SERVER_NAME if name.is_some() => return Err(Unreadable::Malformed),
            SERVER_NAME => name = Some(host_name(body)?),
            ENCRYPTED_CLIENT_HELLO => return Err(Unreadable::Encrypted),
            _ => {}
        }
    }
    Ok(name.map_or(Hello::NoName, Hello::Name))
}

/// The `server_name` extension's one `host_name` (RFC 6066, section 3: one
/// name of each type, and `host_name` is the only type), as servers such as
/// OpenSSL read it: a list holding exactly one entry, an ASCII name.
fn host_name(ext: &[u8]) -> Result<String, Unreadable> {
    let mut ext = Reader(ext);
    let list_len = ext.u16()? as usize;
    let mut list = Reader(ext.take(list_len)?);
    let name_type = list.u8()?;
    let name_len = list.u16()? as usize;
    let name = list.take(name_len)?;
    let well_formed = ext.0.is_empty()
        && list.0.is_empty()
        && name_type == 0
        && !name.is_empty()
        && name.iter().all(|b| b.is_ascii_graphic());
    if !well_formed {
        return Err(Unreadable::Malformed);
    }
    Ok(String::from_utf8_lossy(name).to_ascii_lowercase())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Unreadable> {
        if self.0.len() < n {
            return Err(Unreadable::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn skip(&mut self, n: usize) -> Result<(), Unreadable> {
        self.take(n).map(|_| ())
    }
    fn u8(&mut self) -> Result<u8, Unreadable> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Result<u16, Unreadable> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Builds ClientHellos field by field, as a TLS client would.
    pub struct Builder {
        extensions: Vec<(u16, Vec<u8>)>,
    }

    impl Builder {
        /// A hello naming `host` (none: no `server_name` extension).
        pub fn new(host: Option<&str>) -> Self {
            let mut b = Self { extensions: vec![] };
            if let Some(host) = host {
                b = b.extension(SERVER_NAME, server_name_list(&[(0, host.as_bytes())]));
            }
            b
        }

        pub fn extension(mut self, kind: u16, body: Vec<u8>) -> Self {
            self.extensions.push((kind, body));
            self
        }

        /// A `padding` extension (RFC 7685) of `n` bytes.
        pub fn padding(self, n: usize) -> Self {
            self.extension(21, vec![0; n])
        }

        /// The handshake message: its header, then the hello's body.
        pub fn message(&self) -> Vec<u8> {
            let mut exts = vec![];
            for (kind, body) in &self.extensions {
                exts.extend(kind.to_be_bytes());
                exts.extend((body.len() as u16).to_be_bytes());
                exts.extend(body);
            }
            let mut body = vec![3, 3]; // legacy version: TLS 1.2
            body.extend([7u8; 32]); // random
            body.push(32); // legacy session id
            body.extend([9u8; 32]);
            body.extend([0, 4, 0x13, 0x01, 0x13, 0x02]); // cipher suites
            body.extend([1, 0]); // compression: null
            body.extend((exts.len() as u16).to_be_bytes());
            body.extend(exts);
            let mut message = vec![CLIENT_HELLO];
            message.extend(&(body.len() as u32).to_be_bytes()[1..]);
            message.extend(body);
            message
        }

        /// The hello in one record.
        pub fn record(&self) -> Vec<u8> {
            records(&self.message(), &[], 3)
        }
    }

    /// Offset in [`Builder::message`] just past the compression methods,
    /// where a reader of the first record alone would see a hello end.
    pub const BEFORE_EXTENSIONS: usize = MESSAGE_HEADER + 2 + 32 + 1 + 32 + 2 + 4 + 2;

    /// A `server_name` extension's body listing `(type, name)` entries.
    fn server_name_list(entries: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = vec![];
        for (kind, name) in entries {
            list.push(*kind);
            list.extend((name.len() as u16).to_be_bytes());
            list.extend(*name);
        }
        let mut body = (list.len() as u16).to_be_bytes().to_vec();
        body.extend(list);
        body
    }

    /// `message` cut at the offsets `cuts` into handshake records of
    /// version `major`.1.
    pub fn records(message: &[u8], cuts: &[usize], major: u8) -> Vec<u8> {
        let mut out = vec![];
        let mut from = 0;
        for &to in cuts.iter().chain([message.len()].iter()) {
            out.extend([HANDSHAKE, major, 1]);
            out.extend(((to - from) as u16).to_be_bytes());
            out.extend(&message[from..to]);
            from = to;
        }
        out
    }

    fn name(host: &str) -> Result<Option<Hello>, Unreadable> {
        Ok(Some(Hello::Name(host.into())))
    }

    #[test]
    fn a_single_record_hello_is_read() {
        assert_eq!(client_hello(&Builder::new(Some("PyPI.org")).record()), name("pypi.org"));
        assert_eq!(client_hello(&Builder::new(None).record()), Ok(Some(Hello::NoName)));
        let h = Builder::new(Some("pypi.org")).record();
        assert_eq!(client_hello(&h[..20]), Ok(None), "a partial hello asks for more");
        let mut early = h.clone();
        early.extend([23, 3, 3, 0, 1, 0]); // early data after the hello is not read
        assert_eq!(client_hello(&early), name("pypi.org"));
    }

    #[test]
    fn a_hello_split_across_records_is_read_whole() {
        let message = Builder::new(Some("evil.example")).message();
        // Cut where a reader of the first record would see a hello without
        // extensions, and in the middle of the name.
        let split = records(&message, &[BEFORE_EXTENSIONS, message.len() - 4], 3);
        assert_eq!(client_hello(&split), name("evil.example"));
        // Down to a record per byte of the handshake header.
        assert_eq!(client_hello(&records(&message, &[1, 2, 3, 4], 3)), name("evil.example"));
        let first_only = records(&message, &[BEFORE_EXTENSIONS], 3);
        assert_eq!(client_hello(&first_only[..first_only.len() - 1]), Ok(None));
    }

    #[test]
    fn a_record_version_other_than_3_is_refused() {
        let message = Builder::new(Some("pypi.org")).message();
        assert_eq!(client_hello(&records(&message, &[], 2)), Err(Unreadable::Version(2)));
        assert_eq!(
            client_hello(&[HANDSHAKE, 4]),
            Err(Unreadable::Version(4)),
            "as soon as seen"
        );
        let second = records(&message, &[BEFORE_EXTENSIONS], 3);
        let mut second = second.clone();
        second[RECORD_HEADER + BEFORE_EXTENSIONS + 1] = 0; // the second record's major version
        assert_eq!(client_hello(&second), Err(Unreadable::Version(0)));
    }

    #[test]
    fn what_is_not_a_client_hello_is_refused() {
        assert_eq!(client_hello(b"GET / HTTP/1.1\r\n\r\n"), Err(Unreadable::NotHandshake));
        assert_eq!(client_hello(b"G"), Err(Unreadable::NotHandshake), "as soon as seen");
        // An application-data record, and a handshake of another message type.
        assert_eq!(client_hello(&[23, 3, 3, 0, 1, 0]), Err(Unreadable::NotHandshake));
        let mut finished = Builder::new(Some("pypi.org")).message();
        finished[0] = 20;
        assert_eq!(
            client_hello(&records(&finished, &[], 3)),
            Err(Unreadable::NotClientHello)
        );
        // A second record that is not a handshake one, in the middle of the hello.
        let message = Builder::new(Some("pypi.org")).message();
        let mut mixed = records(&message, &[BEFORE_EXTENSIONS], 3);
        mixed[RECORD_HEADER + BEFORE_EXTENSIONS] = 23;
        assert_eq!(client_hello(&mixed), Err(Unreadable::NotHandshake));
    }

    #[test]
    fn a_malformed_hello_is_refused() {
        let message = Builder::new(Some("pypi.org")).message();
        // Handshake bytes after the hello, in its record.
        let mut trailing = message.clone();
        trailing.extend([CLIENT_HELLO, 0, 0, 0]);
        assert_eq!(client_hello(&records(&trailing, &[], 3)), Err(Unreadable::Malformed));
        // An empty record.
        assert_eq!(client_hello(&[HANDSHAKE, 3, 1, 0, 0]), Err(Unreadable::Malformed));
        // Two server names, two entries, a name that is not a host_name or not ASCII.
        let two = Builder::new(Some("pypi.org")).extension(SERVER_NAME, server_name_list(&[(0, b"evil.example")]));
        assert_eq!(client_hello(&two.record()), Err(Unreadable::Malformed));
        for entries in [
            server_name_list(&[(0, b"pypi.org"), (0, b"evil.example")]),
            server_name_list(&[(1, b"evil.example")]),
            server_name_list(&[(0, "pypi.org\u{e9}".as_bytes())]),
            server_name_list(&[(0, b"pypi.org\0evil")]),
        ] {
            let hello = Builder::new(None).extension(SERVER_NAME, entries);
            assert_eq!(client_hello(&hello.record()), Err(Unreadable::Malformed));
        }
        // A hello cut short inside its record, and one whose extensions overrun it.
        let mut short = message.clone();
        short.truncate(message.len() - 3);
        let body_len = (short.len() - MESSAGE_HEADER) as u32;
        short[1..4].copy_from_slice(&body_len.to_be_bytes()[1..]);
        assert_eq!(client_hello(&records(&short, &[], 3)), Err(Unreadable::Malformed));
        // An encrypted hello hides the name that counts.
        let ech = Builder::new(Some("pypi.org")).extension(ENCRYPTED_CLIENT_HELLO, vec![0; 8]);
        assert_eq!(client_hello(&ech.record()), Err(Unreadable::Encrypted));
    }

    #[test]
    fn an_oversized_hello_or_one_in_too_many_records_is_refused() {
        // Past the bound, whether the hello says so or its records do.
        let big = Builder::new(Some("evil.example")).padding(MAX_HANDSHAKE).message();
        let split = records(&big, &[BEFORE_EXTENSIONS, 16_000], 3);
        assert_eq!(client_hello(&split), Err(Unreadable::TooLarge));
        let mut lying = Builder::new(Some("evil.example")).message();
        lying[1..4].copy_from_slice(&(MAX_HANDSHAKE as u32).to_be_bytes()[1..]);
        assert_eq!(client_hello(&records(&lying, &[], 3)), Err(Unreadable::TooLarge));
        assert_eq!(
            client_hello(&[HANDSHAKE, 3, 1, 0x40, 1]),
            Err(Unreadable::TooLarge),
            "before its bytes"
        );
        let message = Builder::new(Some("evil.example")).message();
        let cuts: Vec<usize> = (BEFORE_EXTENSIONS..message.len()).collect();
        assert_eq!(
            client_hello(&records(&message, &cuts, 3)),
            Err(Unreadable::TooManyRecords)
        );
        // The largest hello in the most records allowed is read, and more
        // bytes are never asked for beyond MAX_BUFFERED.
        let pad = MAX_HANDSHAKE - Builder::new(Some("pypi.org")).message().len() - 4;
        let largest = Builder::new(Some("pypi.org")).padding(pad).message();
        assert_eq!(largest.len(), MAX_HANDSHAKE);
        let cuts: Vec<usize> = (1..MAX_RECORDS).map(|i| i * 1000).collect();
        let bytes = records(&largest, &cuts, 3);
        assert_eq!(bytes.len(), MAX_BUFFERED);
        assert_eq!(client_hello(&bytes), name("pypi.org"));
        for end in (0..bytes.len()).step_by(97) {
            assert_eq!(client_hello(&bytes[..end]), Ok(None));
        }
    }
}
