//! Reads: windows of text cut at character boundaries, and the kind of
//! file (image, binary) told by its first bytes.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::SystemTime;

use super::{io, modified, open_regular, Result, ResultsPath, MAX_READ_BYTES};

/// How much of the end of a large file a first read shows.
const TAIL_BYTES: usize = 2048;
/// How much of a file's start decides whether it is text.
const SNIFF_BYTES: usize = 8192;

/// A window of text, or what kind of file it is.
#[derive(Debug)]
pub enum Content {
    Text(TextWindow),
    /// An image (by its first bytes, or `.svg`), with its media type and the
    /// opened file, for whoever presents it.
    Image {
        mime: &'static str,
        file: File,
    },
    /// Neither text nor an image.
    Binary,
    /// The bytes asked for, whatever the file holds.
    Bytes(ByteWindow),
}

/// Bytes of a file from an offset, for a client that downloads through
/// its MCP connection (no link, no second channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteWindow {
    pub data: Vec<u8>,
    pub offset: u64,
    /// Where the next window starts; `None` when this one reached the end.
    pub next_offset: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextWindow {
    /// The text from `offset` (invalid UTF-8 replaced).
    pub text: String,
    /// Where the text starts: the requested offset, moved forward to the
    /// start of a character when it fell inside one.
    pub offset: u64,
    /// Where the next window starts; `None` when this one reached the end.
    pub next_offset: Option<u64>,
    /// The file's last lines, on a first read of a file larger than the window.
    pub tail: Option<String>,
}

/// Which part of a file to read.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub offset: u64,
    pub max_bytes: usize,
    /// Stop after this many lines (0: no line limit; not for `bytes`).
    pub max_lines: usize,
    /// The bytes themselves, of any file, instead of a text window or the
    /// file's kind.
    pub bytes: bool,
}

#[derive(Debug)]
pub struct FileRead {
    pub path: ResultsPath,
    pub size: u64,
    pub modified: SystemTime,
    pub content: Content,
}

/// Reads the file `path` beneath `root`: a window of text, or what kind of
/// file it is (an image comes with the opened file).
pub fn read(root: &Path, path: &ResultsPath, window: Window) -> Result<FileRead> {
    let (file, st) = open_regular(root, path)?;
    let size = st.st_size as u64;
    let mut sniff = vec![0u8; SNIFF_BYTES.min(size as usize)];
    let n = read_at(&file, &mut sniff, 0).map_err(io(path))?;
    sniff.truncate(n);
    let content = match image_type(path, &sniff) {
        _ if window.bytes => Content::Bytes(byte_window(&file, size, window).map_err(io(path))?),
        Some(mime) => Content::Image { mime, file },
        None if !is_text(&sniff, n as u64 == size) => Content::Binary,
        None => Content::Text(text_window(&file, size, window).map_err(io(path))?),
    };
    Ok(FileRead {
        path: path.clone(),
        size,
        modified: modified(&st),
        content,
    })
}

/// Reads up to `buf.len()` bytes at `offset` (fewer only at the end).
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The media type of an image, by its first bytes (or `.svg` by name).
fn image_type(path: &ResultsPath, head: &[u8]) -> Option<&'static str> {
    let magic: [(&[u8], &'static str); 5] = [
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"RIFF", "image/webp"),
    ];
    let found = magic
        .iter()
        .find(|(m, mime)| head.starts_with(m) && (*mime != "image/webp" || head.get(8..12) == Some(b"WEBP")))
        .map(|(_, mime)| *mime);
    let svg = path.name().is_some_and(|n| n.to_ascii_lowercase().ends_with(".svg"));
    found.or(svg.then_some("image/svg+xml"))
}

/// Text: no NUL byte and valid UTF-8 (a character cut by the end of the
/// sample aside, unless the sample is the whole file).
fn is_text(sample: &[u8], whole: bool) -> bool {
    if sample.contains(&0) {
        return false;
    }
    match std::str::from_utf8(sample) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && !whole,
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// The window of text at `window.offset`, cut at character boundaries.
fn text_window(file: &File, size: u64, window: Window) -> std::io::Result<TextWindow> {
    // At least 4 bytes: a window always holds a whole character.
    let max_bytes = window.max_bytes.clamp(4, MAX_READ_BYTES);
    let start = window.offset.min(size);
    // Three bytes more on each side, to move the window's start and end to
    // character boundaries.
    let mut buf = vec![0u8; (max_bytes + 6).min((size - start) as usize)];
    let n = read_at(file, &mut buf, start)?;
    buf.truncate(n);
    let skip = buf.iter().take(3).take_while(|b| is_continuation(**b)).count();
    let offset = start + skip as u64;
    let mut end = (skip + max_bytes).min(buf.len());
    if end < buf.len() {
        // More follows: back to the start of the character the window cuts
        // (at most 3 bytes; further back it is not UTF-8, cut where it is).
        let mut cut = end;
        while end - cut < 3 && is_continuation(buf[cut]) {
            cut -= 1;
        }
        if !is_continuation(buf[cut]) {
            end = cut;
        }
    }
    let mut text = &buf[skip..end];
    if window.max_lines > 0 {
        let mut newlines = text.iter().enumerate().filter(|(_, b)| **b == b'\n');
        if let Some((i, _)) = newlines.nth(window.max_lines - 1) {
            text = &text[..=i];
        }
    }
    let next = offset + text.len() as u64;
    let next_offset = (next < size).then_some(next);
    let tail = match (window.offset, next_offset) {
        (0, Some(from)) => Some(tail(file, size, from, max_bytes.min(TAIL_BYTES))?),
        _ => None,
    };
    Ok(TextWindow {
        text: String::from_utf8_lossy(text).into_owned(),
        offset,
        next_offset,
        tail,
    })
}

/// At most `window.max_bytes` (and `MAX_READ_BYTES`) bytes from
/// `window.offset`.
fn byte_window(file: &File, size: u64, window: Window) -> std::io::Result<ByteWindow> {
    let offset = window.offset.min(size);
    let mut data = vec![0u8; window.max_bytes.min(MAX_READ_BYTES).min((size - offset) as usize)];
    let n = read_at(file, &mut data, offset)?;
    data.truncate(n);
    let next = offset + n as u64;
    Ok(ByteWindow {
        data,
        offset,
        next_offset: (next < size).then_some(next),
    })
}

/// The end of the file after `from`: its last `bytes` at most, from the
/// first whole line in them when they start inside one.
fn tail(file: &File, size: u64, from: u64, bytes: usize) -> std::io::Result<String> {
    let start = size.saturating_sub(bytes as u64).max(from);
    let mut buf = vec![0u8; (size - start) as usize];
    let n = read_at(file, &mut buf, start)?;
    buf.truncate(n);
    let body = match buf[..buf.len().saturating_sub(1)].iter().position(|b| *b == b'\n') {
        Some(i) if start > from => &buf[i + 1..],
        _ => {
            let skip = buf.iter().take(3).take_while(|b| is_continuation(**b)).count();
            &buf[skip..]
        }
    };
    Ok(String::from_utf8_lossy(body).into_owned())
}
