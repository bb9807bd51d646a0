//! Images shown to the model inline, as MCP `image` items, on a budget.
//!
//! A multimodal model cannot open a link, but every image item costs
//! context: so each image is downscaled and re-encoded until it fits a byte
//! budget, one result carries only a few (newest first) within a budget of
//! its own, and the links stay for the full files.
//!
//! The files are the sandbox's, hence hostile. They are opened beneath the
//! results folder by [`sandbox_actors::files`], as artifacts and the file
//! tools are (no link followed, only a regular file opened); read up to a
//! size cap; and decoded off the async runtime, with the dimensions in the
//! header checked before any pixel is allocated, a cap on the decoder's
//! memory, a deadline and a cap on decodes running at once. A file that
//! fails any of these is not inlined, and the result says why.

use std::borrow::Cow;
use std::fs::File;
use std::io::{Cursor, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::{CompressionType, FilterType, PngEncoder};
use image::error::LimitErrorKind;
use image::{ColorType, DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};
use sandbox_actors::files::{open_file, ResultsPath};
use schemars::JsonSchema;
use serde::Serialize;
use tokio::sync::Semaphore;

/// Longest side of an inline image. Model APIs downscale larger images
/// themselves (Anthropic's beyond 1568 px), so more pixels only cost bytes.
pub const MAX_SIDE: u32 = 1568;
/// Smallest longest side a downscale tries before giving up on the budget.
const MIN_SIDE: u32 = 32;
/// Largest file read; larger images are only linked.
pub const MAX_FILE_BYTES: u64 = 32 << 20;
/// Largest width or height handed to a decoder, checked in the header.
pub const MAX_DIMENSION: u32 = 10_000;
/// Most memory a decoder may take for the pixels (a 4096 × 4096 RGBA image).
pub const MAX_DECODE_BYTES: u64 = 64 << 20;
/// Time for all the images of one result, waiting for a decoder included.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Images decoded at once, server-wide: a decode holds a blocking thread
/// and up to a few times [`MAX_DECODE_BYTES`] until it ends, even when its
/// caller stopped waiting.
const DECODERS: usize = 2;
const JPEG_QUALITY: u8 = 80;
/// What a JPEG's decode takes against its output pixels: the pixels and
/// 2 bytes of coefficients per pixel and component (4 for CMYK).
const JPEG_DECODE_FACTOR: u64 = 4;
/// Longest wait for a free decoder: a tenant keeping both busy delays the
/// others' results by at most this, never by the whole deadline.
const DECODER_WAIT: Duration = Duration::from_secs(1);

/// Why an image is not shown inline (its link still serves the file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotInlined {
    #[error("inline images are off on this server (results.inline_images)")]
    Off,
    #[error("not a regular file beneath /app/results (links are not followed)")]
    Unreadable,
    #[error("the file has {bytes} bytes; images above {max} bytes are only linked", max = MAX_FILE_BYTES)]
    FileTooLarge { bytes: u64 },
    #[error("SVG is only linked; save a PNG to see the picture")]
    Svg,
    #[error("not a PNG, JPEG, GIF or WebP image")]
    Format,
    #[error("more than {max} px wide or high", max = MAX_DIMENSION)]
    Dimensions,
    #[error("decoding it would take more than {max} MiB", max = MAX_DECODE_BYTES >> 20)]
    Memory,
    #[error("it does not decode: {0}")]
    Corrupt(String),
    #[error("even at {min} px it takes more than the {max_bytes} bytes left for images", min = MIN_SIDE)]
    TooDetailed { max_bytes: usize },
    #[error("the time for this result's images ran out")]
    Deadline,
    #[error("the server is busy decoding other images")]
    Busy,
}

/// An image ready to be sent inline.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InlineImage {
    pub mime: &'static str,
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
    pub width: u32,
    pub height: u32,
}

/// An inline image as another node's answer carries it.
#[derive(serde::Deserialize)]
struct WireImage {
    mime: String,
    #[serde(with = "base64_bytes")]
    data: Vec<u8>,
    width: u32,
    height: u32,
}

/// The image types sent inline; another node's answer names one of them.
const MIMES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

impl<'de> serde::Deserialize<'de> for InlineImage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = WireImage::deserialize(d)?;
        let mime = MIMES
            .into_iter()
            .find(|m| *m == w.mime)
            .ok_or_else(|| serde::de::Error::custom(format!("not an inline image type: {}", w.mime)))?;
        Ok(Self {
            mime,
            data: w.data,
            width: w.width,
            height: w.height,
        })
    }
}

/// Image bytes in another node's answer, as base64.
mod base64_bytes {
    use base64::Engine;

    pub fn serialize<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <String as serde::Deserialize>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// An image among a run's files, and how it is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, JsonSchema)]
pub struct ImageNote {
    /// Absolute path in the sandbox.
    pub path: String,
    /// Shown as an `image` item (these come after the links, in this order).
    pub inline: bool,
    /// Size of the image item in pixels (smaller than the file's when downscaled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Why it is not shown inline; its link serves the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The images of one run: those to send, in order, and a note per image tried.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RunImages {
    pub images: Vec<InlineImage>,
    pub notes: Vec<ImageNote>,
}

/// What may be shown inline (the `[results]` keys of that name).
#[derive(Debug, Clone, Copy)]
pub struct Budgets {
    pub enabled: bool,
    /// Largest image, in bytes of the encoded image.
    pub max_bytes: usize,
    /// All images of one result together.
    pub result_max_bytes: usize,
    /// Most images in one result.
    pub per_result: usize,
}

/// The budgets, from `[results]`, and the server-wide cap on decodes.
#[derive(Clone)]
pub struct Inliner {
    enabled: bool,
    max_bytes: usize,
    result_max_bytes: usize,
    per_result: usize,
    decoders: Arc<Semaphore>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Raster,
    Svg,
}

/// Which files are images, by name; the content decides the format.
fn kind(path: &str) -> Option<Kind> {
    let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
    match ext.as_str() {
        "png" | "jpg" | "jpeg" | "gif" | "webp" => Some(Kind::Raster),
        "svg" => Some(Kind::Svg),
        _ => None,
    }
}

impl Inliner {
    pub fn new(budgets: Budgets) -> Self {
        Self {
            enabled: budgets.enabled,
            max_bytes: budgets.max_bytes,
            result_max_bytes: budgets.result_max_bytes,
            per_result: budgets.per_result,
            decoders: Arc::new(Semaphore::new(DECODERS)),
        }
    }

    /// The image file `path` (under `/app/results`, absolute or relative)
    /// in the results folder `root` (a host folder), fitted into `max_bytes`
    /// by `deadline`: the one entry point for anything that shows an image
    /// file inline. A single image takes [`Inliner::max_bytes`] and now +
    /// [`DEADLINE`]; a run's images share theirs ([`Inliner::run`]).
    pub async fn image(
        &self,
        root: &Path,
        path: &str,
        max_bytes: usize,
        deadline: Instant,
    ) -> Result<InlineImage, NotInlined> {
        let path = ResultsPath::parse(path).map_err(|_| NotInlined::Unreadable)?;
        let root = root.to_path_buf();
        self.decode(max_bytes, deadline, move || opened(&root, &path)).await
    }

    /// As [`Inliner::image`], for an image file already opened safely
    /// beneath a results folder ([`sandbox_actors::files::read`]).
    pub async fn image_file(&self, file: File, max_bytes: usize, deadline: Instant) -> Result<InlineImage, NotInlined> {
        self.decode(max_bytes, deadline, move || Ok(file)).await
    }

    /// Whether any of a run's `files` may be shown inline: otherwise there
    /// is nothing to look at (nor to ask the node holding the sandbox).
    pub fn may_show_any(&self, files: &[String]) -> bool {
        self.enabled && files.iter().any(|f| kind(f).is_some())
    }

    /// The budget of a single image, `results.inline_image_max_bytes`.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Opens (`open`), reads and fits an image off the async runtime, once
    /// one of the server's decoders is free.
    async fn decode(
        &self,
        max_bytes: usize,
        deadline: Instant,
        open: impl FnOnce() -> Result<File, NotInlined> + Send + 'static,
    ) -> Result<InlineImage, NotInlined> {
        if !self.enabled {
            return Err(NotInlined::Off);
        }
        let at = tokio::time::Instant::from_std(deadline);
        let wait = at.min(tokio::time::Instant::now() + DECODER_WAIT);
        let permit = tokio::time::timeout_at(wait, self.decoders.clone().acquire_owned())
            .await
            .map_err(|_| NotInlined::Busy)?
            .expect("the semaphore is never closed");
        // The permit goes with the work: a decode that outlives its deadline
        // still counts against the cap until it ends.
        let work = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            fit(&read(open()?)?, max_bytes, deadline)
        });
        match tokio::time::timeout_at(at, work).await {
            Err(_) => Err(NotInlined::Deadline),
            Ok(Err(_)) => Err(NotInlined::Corrupt("the decoder failed".into())),
            Ok(Ok(fitted)) => fitted,
        }
    }

    /// The images a run showed (`shown`, in their order) and then those
    /// among its `files` (newest first), absolute paths in the sandbox under
    /// `root`: at most `inline_images_per_result`, together within
    /// `inline_result_max_bytes`, all within [`DEADLINE`]. Images are tried
    /// until that many are shown or twice that many were tried; the others
    /// are only linked, without a note.
    pub async fn run(&self, root: &Path, shown: &[String], files: &[String]) -> RunImages {
        let mut out = RunImages::default();
        if !self.may_show_any(shown) && !self.may_show_any(files) {
            return out;
        }
        let deadline = Instant::now() + DEADLINE;
        let candidates: Vec<String> = files.iter().filter(|f| kind(f).is_some()).cloned().collect();
        let dir = root.to_path_buf();
        let newest = tokio::task::spawn_blocking(move || newest_first(&dir, candidates))
            .await
            .unwrap_or_default();
        let shown = shown.iter().filter(|f| kind(f).is_some()).cloned();
        let mut left = self.result_max_bytes;
        for path in shown.chain(newest).take(2 * self.per_result) {
            if out.images.len() == self.per_result || left == 0 || Instant::now() >= deadline {
                break;
            }
            let fitted = match kind(&path) {
                Some(Kind::Svg) => Err(NotInlined::Svg),
                _ => self.image(root, &path, left.min(self.max_bytes), deadline).await,
            };
            out.notes.push(match fitted {
                Ok(image) => {
                    left -= image.data.len();
                    let note = ImageNote {
                        path,
                        inline: true,
                        width: Some(image.width),
                        height: Some(image.height),
                        reason: None,
                    };
                    out.images.push(image);
                    note
                }
                Err(why) => {
                    tracing::debug!(path, reason = %why, "image not inlined");
                    ImageNote {
                        path,
                        inline: false,
                        width: None,
                        height: None,
                        reason: Some(why.to_string()),
                    }
                }
            });
        }
        out
    }
}

/// The regular file `path` beneath `root`, opened without following links.
fn opened(root: &Path, path: &ResultsPath) -> Result<File, NotInlined> {
    open_file(root, path)
        .map(|(file, _)| file)
        .map_err(|_| NotInlined::Unreadable)
}

/// `files` that are still regular files beneath `root`, most recently
/// modified first (ties keep their order).
fn newest_first(root: &Path, files: Vec<String>) -> Vec<String> {
    let mut dated: Vec<(SystemTime, String)> = files
        .into_iter()
        .filter_map(|f| {
            let file = opened(root, &ResultsPath::parse(&f).ok()?).ok()?;
            Some((file.metadata().ok()?.modified().ok()?, f))
        })
        .collect();
    dated.sort_by_key(|d| std::cmp::Reverse(d.0));
    dated.into_iter().map(|(_, f)| f).collect()
}

/// The bytes of an opened image file of at most [`MAX_FILE_BYTES`].
fn read(file: File) -> Result<Vec<u8>, NotInlined> {
    let len = file.metadata().map_err(|_| NotInlined::Unreadable)?.len();
    if len > MAX_FILE_BYTES {
        return Err(NotInlined::FileTooLarge { bytes: len });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|_| NotInlined::Unreadable)?;
    // It may have grown since it was measured.
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(NotInlined::FileTooLarge {
            bytes: bytes.len() as u64,
        });
    }
    Ok(bytes)
}

fn limits() -> Limits {
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_DIMENSION);
    limits.max_image_height = Some(MAX_DIMENSION);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    limits
}

fn refused(e: ImageError) -> NotInlined {
    match e {
        ImageError::Limits(l) if l.kind() == LimitErrorKind::DimensionError => NotInlined::Dimensions,
        ImageError::Limits(_) => NotInlined::Memory,
        e => NotInlined::Corrupt(e.to_string()),
    }
}

fn past(deadline: Instant) -> Result<(), NotInlined> {
    match Instant::now() >= deadline {
        true => Err(NotInlined::Deadline),
        false => Ok(()),
    }
}

/// Fits the image file `bytes` into `max_bytes` by `deadline`: as it is
/// when it fits and is at most [`MAX_SIDE`] px a side, else downscaled and
/// re-encoded as PNG or JPEG, whichever is smaller. Blocking; CPU-bound.
pub fn fit(bytes: &[u8], max_bytes: usize, deadline: Instant) -> Result<InlineImage, NotInlined> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|_| NotInlined::Format)?;
    let mime = match reader.format() {
        Some(ImageFormat::Png) => "image/png",
        Some(ImageFormat::Jpeg) => "image/jpeg",
        Some(ImageFormat::Gif) => "image/gif",
        Some(ImageFormat::WebP) => "image/webp",
        _ => return Err(NotInlined::Format),
    };
    reader.limits(limits());
    // Reads the header only, and refuses dimensions beyond the limits.
    let decoder = reader.into_decoder().map_err(refused)?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(NotInlined::Corrupt("the image has no pixels".into()));
    }
    // The pixels are allocated at once: refuse before, not during. A JPEG
    // decoder also keeps 16-bit coefficients of every component (a
    // progressive one for the whole image), which the limit does not see.
    let pixels = decoder.total_bytes();
    let needs = match mime {
        "image/jpeg" => pixels.saturating_mul(JPEG_DECODE_FACTOR),
        _ => pixels,
    };
    limits().reserve(needs).map_err(refused)?;
    let image = DynamicImage::from_decoder(decoder).map_err(refused)?;
    past(deadline)?;
    if bytes.len() <= max_bytes && width.max(height) <= MAX_SIDE {
        return Ok(InlineImage {
            mime,
            data: bytes.to_vec(),
            width,
            height,
        });
    }
    shrink(&eight_bit(&image), max_bytes, deadline)
}

/// Downscales until the smaller encoding fits, estimating each step from
/// the last (bytes grow about with the area).
fn shrink(image: &DynamicImage, max_bytes: usize, deadline: Instant) -> Result<InlineImage, NotInlined> {
    let longest = image.width().max(image.height());
    let mut side = longest.min(MAX_SIDE);
    loop {
        past(deadline)?;
        let scaled = match side < longest {
            true => Cow::Owned(image.thumbnail(side, side)),
            false => Cow::Borrowed(image),
        };
        let encoded = smallest(&scaled)?;
        if encoded.data.len() <= max_bytes {
            return Ok(encoded);
        }
        if side <= MIN_SIDE {
            return Err(NotInlined::TooDetailed { max_bytes });
        }
        let ratio = (max_bytes as f64 / encoded.data.len() as f64).sqrt() * 0.9;
        side = ((f64::from(side) * ratio) as u32).clamp(MIN_SIDE, side - 1);
    }
}

/// 8 bits a channel, and no alpha channel when every pixel is opaque (so
/// that JPEG, which has none, can be tried).
fn eight_bit(image: &DynamicImage) -> DynamicImage {
    let gray = matches!(
        image.color(),
        ColorType::L8 | ColorType::La8 | ColorType::L16 | ColorType::La16
    );
    match (gray, image.has_alpha()) {
        (true, false) => image.to_luma8().into(),
        (false, false) => image.to_rgb8().into(),
        (true, true) => {
            let la = image.to_luma_alpha8();
            match la.pixels().all(|p| p.0[1] == u8::MAX) {
                true => image.to_luma8().into(),
                false => la.into(),
            }
        }
        (false, true) => {
            let rgba = image.to_rgba8();
            match rgba.pixels().all(|p| p.0[3] == u8::MAX) {
                true => image.to_rgb8().into(),
                false => rgba.into(),
            }
        }
    }
}

/// The smaller of PNG and (for opaque images) JPEG.
fn smallest(image: &DynamicImage) -> Result<InlineImage, NotInlined> {
    let encode = |mime: &'static str| {
        let mut data = Vec::new();
        let written = match mime {
            "image/png" => image.write_with_encoder(PngEncoder::new_with_quality(
                &mut data,
                CompressionType::Best,
                FilterType::Adaptive,
            )),
            _ => image.write_with_encoder(JpegEncoder::new_with_quality(&mut data, JPEG_QUALITY)),
        };
        written.ok().map(|()| InlineImage {
            mime,
            data,
            width: image.width(),
            height: image.height(),
        })
    };
    let png = encode("image/png").ok_or_else(|| NotInlined::Corrupt("the image could not be encoded".into()))?;
    Ok(match image.has_alpha() {
        true => png,
        false => match encode("image/jpeg") {
            Some(jpeg) if jpeg.data.len() < png.data.len() => jpeg,
            _ => png,
        },
    })
}

#[cfg(test)]
mod tests {
    use sandbox_runtime::agent::RESULTS_IN_CONTAINER;

    use super::*;

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn png(image: &DynamicImage) -> Vec<u8> {
        let mut out = Vec::new();
        image.write_with_encoder(PngEncoder::new(&mut out)).unwrap();
        out
    }

    /// A plot-like picture: flat background, a few lines.
    fn plot(width: u32, height: u32) -> DynamicImage {
        image::RgbImage::from_fn(width, height, |x, y| {
            match (x % 97 < 2) || (y % 53 < 2) || x == y * width / height {
                true => image::Rgb([30, 90, 200]),
                false => image::Rgb([255, 255, 255]),
            }
        })
        .into()
    }

    /// Noise, which no encoder shrinks.
    fn noise(width: u32, height: u32) -> DynamicImage {
        let mut state = 0x2545_f491_u32;
        image::RgbImage::from_fn(width, height, |_, _| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let [a, b, c, _] = state.to_le_bytes();
            image::Rgb([a, b, c])
        })
        .into()
    }

    /// A PNG of `width` × `height` RGBA pixels, all zero, as a hostile
    /// sandbox would write it by hand: its header claims the size and its
    /// data inflates to it (or is cut off after `keep` bytes).
    fn handmade_png(width: u32, height: u32, rows: u32, keep: Option<usize>) -> Vec<u8> {
        use std::io::Write;
        fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
            out.extend((data.len() as u32).to_be_bytes());
            let start = out.len();
            out.extend(kind);
            out.extend(data);
            let crc = crc32fast::hash(&out[start..]);
            out.extend(crc.to_be_bytes());
        }
        let mut ihdr = Vec::new();
        ihdr.extend(width.to_be_bytes());
        ihdr.extend(height.to_be_bytes());
        ihdr.extend([8, 6, 0, 0, 0]);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        let row = vec![0u8; 1 + 4 * width as usize];
        for _ in 0..rows {
            z.write_all(&row).unwrap();
        }
        let mut idat = z.finish().unwrap();
        if let Some(keep) = keep {
            idat.truncate(keep);
        }
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        chunk(&mut out, b"IHDR", &ihdr);
        chunk(&mut out, b"IDAT", &idat);
        if keep.is_none() {
            chunk(&mut out, b"IEND", &[]);
        }
        out
    }

    fn decoded(image: &InlineImage) -> DynamicImage {
        image::load_from_memory(&image.data).unwrap()
    }

    #[test]
    fn a_small_image_is_sent_as_it_is() {
        let bytes = png(&plot(640, 480));
        let shown = fit(&bytes, 64 * 1024, later()).unwrap();
        assert_eq!((shown.mime, shown.width, shown.height), ("image/png", 640, 480));
        assert_eq!(shown.data, bytes);
    }

    #[test]
    fn jpeg_gif_and_webp_are_read_too() {
        let image = plot(120, 80);
        for (format, mime) in [
            (ImageFormat::Jpeg, "image/jpeg"),
            (ImageFormat::Gif, "image/gif"),
            (ImageFormat::WebP, "image/webp"),
        ] {
            let mut bytes = Cursor::new(Vec::new());
            image.write_to(&mut bytes, format).unwrap();
            let shown = fit(bytes.get_ref(), 64 * 1024, later()).unwrap();
            assert_eq!((shown.mime, shown.width, shown.height), (mime, 120, 80));
        }
    }

    #[test]
    fn a_large_image_is_downscaled_to_the_longest_side_keeping_its_shape() {
        let shown = fit(&png(&plot(4000, 2000)), 1 << 20, later()).unwrap();
        assert_eq!((shown.width, shown.height), (MAX_SIDE, MAX_SIDE / 2));
        let back = decoded(&shown);
        assert_eq!((back.width(), back.height()), (MAX_SIDE, MAX_SIDE / 2));
    }

    #[test]
    fn an_image_over_its_budget_is_shrunk_until_it_fits() {
        let bytes = png(&noise(800, 600));
        let max = 20_000;
        assert!(bytes.len() > max);
        let shown = fit(&bytes, max, later()).unwrap();
        assert!(shown.data.len() <= max, "{}", shown.data.len());
        assert!(shown.width < 800 && shown.width >= MIN_SIDE);
        let ratio = f64::from(shown.width) / f64::from(shown.height);
        assert!((ratio - 4.0 / 3.0).abs() < 0.05, "{ratio}");
        let back = decoded(&shown);
        assert_eq!((back.width(), back.height()), (shown.width, shown.height));
    }

    #[test]
    fn the_smaller_encoding_wins_and_transparency_stays_png() {
        // Noise compresses far better as JPEG; a flat plot as PNG.
        let photo = fit(&png(&noise(2000, 1000)), 1 << 20, later()).unwrap();
        assert_eq!(photo.mime, "image/jpeg");
        let chart = fit(&png(&plot(2000, 1000)), 1 << 20, later()).unwrap();
        assert_eq!(chart.mime, "image/png");
        let mut clear = noise(2000, 1000).to_rgba8();
        clear.get_pixel_mut(0, 0).0[3] = 0;
        let clear = fit(&png(&DynamicImage::from(clear)), 1 << 20, later()).unwrap();
        assert_eq!(clear.mime, "image/png");
        assert!(decoded(&clear).has_alpha());
    }

    #[test]
    fn a_budget_too_small_for_the_smallest_size_is_refused() {
        // Below the size of a JPEG's tables and a PNG's smallest noise.
        let refused = fit(&png(&noise(800, 600)), 300, later()).unwrap_err();
        assert_eq!(refused, NotInlined::TooDetailed { max_bytes: 300 });
    }

    #[test]
    fn dimensions_past_the_limit_are_refused_from_the_header() {
        let fits = handmade_png(MAX_DIMENSION, 1, 1, None);
        assert!(fit(&fits, 1 << 20, later()).is_ok());
        for (w, h) in [(MAX_DIMENSION + 1, 1), (1, MAX_DIMENSION + 1), (20_000, 20_000)] {
            // One row of data only: the header alone must decide.
            let bytes = handmade_png(w, h, 1, None);
            assert_eq!(
                fit(&bytes, 1 << 20, later()).unwrap_err(),
                NotInlined::Dimensions,
                "{w}x{h}"
            );
        }
    }

    #[test]
    fn a_decompression_bomb_is_refused_before_it_inflates() {
        // 5000 × 5000 RGBA: 100 MB of pixels from a file of about 100 KB.
        let bomb = handmade_png(5000, 5000, 5000, None);
        assert!(bomb.len() < 200_000, "{}", bomb.len());
        assert_eq!(fit(&bomb, 1 << 20, later()).unwrap_err(), NotInlined::Memory);
        // 4096 × 4096 RGBA is the limit: it decodes, one column more does not.
        assert_eq!(4096 * 4096 * 4, MAX_DECODE_BYTES);
        assert!(fit(&handmade_png(4096, 4096, 4096, None), 1 << 20, later()).is_ok());
        let over = handmade_png(4097, 4096, 1, None);
        assert_eq!(fit(&over, 1 << 20, later()).unwrap_err(), NotInlined::Memory);
    }

    #[test]
    fn corrupt_and_foreign_files_are_refused() {
        let cut = handmade_png(200, 200, 200, Some(40));
        assert!(matches!(fit(&cut, 1 << 20, later()), Err(NotInlined::Corrupt(_))));
        let mut bad_header = png(&plot(64, 64));
        bad_header[16..24].fill(0xff);
        assert!(matches!(
            fit(&bad_header, 1 << 20, later()),
            Err(NotInlined::Corrupt(_))
        ));
        assert_eq!(fit(b"<svg/>", 1 << 20, later()).unwrap_err(), NotInlined::Format);
        assert_eq!(
            fit(b"BM not supported", 1 << 20, later()).unwrap_err(),
            NotInlined::Format
        );
    }

    #[test]
    fn an_image_without_pixels_is_refused_not_encoded() {
        // A 0 × 0 screen holding one 1 × 1 frame with its own palette.
        let mut gif = b"GIF89a\0\0\0\0\0\0\0".to_vec();
        gif.extend([0x2c, 0, 0, 0, 0, 1, 0, 1, 0, 0x80, 0, 0, 0, 255, 255, 255]);
        gif.extend([2, 2, 0x44, 0x01, 0, 0x3b]);
        for max in [1, 1 << 20] {
            assert!(matches!(fit(&gif, max, later()), Err(NotInlined::Corrupt(_))), "{max}");
        }
    }

    #[test]
    fn a_jpeg_is_refused_by_what_its_decoder_takes() {
        let jpeg = |side: u32| {
            let mut bytes = Cursor::new(Vec::new());
            plot(side, side)
                .to_rgb8()
                .write_to(&mut bytes, ImageFormat::Jpeg)
                .unwrap();
            bytes.into_inner()
        };
        // 2400² RGB is 17 MB of pixels, 69 MB with its coefficients.
        assert_eq!(fit(&jpeg(2400), 1 << 20, later()).unwrap_err(), NotInlined::Memory);
        assert!(fit(&jpeg(2000), 1 << 20, later()).is_ok());
    }

    #[test]
    fn a_passed_deadline_stops_the_work() {
        let bytes = png(&plot(4000, 2000));
        assert_eq!(fit(&bytes, 1 << 20, Instant::now()).unwrap_err(), NotInlined::Deadline);
    }

    fn inliner(per_result: usize, max_bytes: usize, result_max_bytes: usize) -> Inliner {
        Inliner::new(Budgets {
            enabled: true,
            max_bytes,
            result_max_bytes,
            per_result,
        })
    }

    fn write(root: &Path, name: &str, bytes: &[u8]) -> String {
        std::fs::write(root.join(name), bytes).unwrap();
        // Distinct modification times, in writing order.
        std::thread::sleep(Duration::from_millis(20));
        format!("{RESULTS_IN_CONTAINER}/{name}")
    }

    #[tokio::test]
    async fn a_run_shows_its_newest_images_up_to_the_count() {
        let root = tempfile::tempdir().unwrap();
        let small = png(&plot(100, 50));
        let mut files: Vec<String> = (0..5)
            .map(|i| write(root.path(), &format!("{i}.png"), &small))
            .collect();
        files.push(write(root.path(), "notes.txt", b"text"));
        let shown = inliner(3, 64 * 1024, 192 * 1024).run(root.path(), &[], &files).await;
        assert_eq!(shown.images.len(), 3);
        let paths: Vec<&str> = shown.notes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            paths,
            ["/app/results/4.png", "/app/results/3.png", "/app/results/2.png"]
        );
        assert!(shown
            .notes
            .iter()
            .all(|n| n.inline && n.width == Some(100) && n.height == Some(50)));
        assert_eq!(shown.images[0].mime, "image/png");
    }

    #[tokio::test]
    async fn images_a_run_showed_come_first_in_their_order() {
        let root = tempfile::tempdir().unwrap();
        let small = png(&plot(100, 50));
        std::fs::create_dir(root.path().join("outputs")).unwrap();
        let shown: Vec<String> = (0..2)
            .map(|i| write(root.path(), &format!("outputs/{i}.png"), &small))
            .collect();
        let files: Vec<String> = (0..2)
            .map(|i| write(root.path(), &format!("{i}.png"), &small))
            .collect();
        let out = inliner(3, 64 * 1024, 192 * 1024).run(root.path(), &shown, &files).await;
        let paths: Vec<&str> = out.notes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/app/results/outputs/0.png",
                "/app/results/outputs/1.png",
                "/app/results/1.png"
            ]
        );
    }

    #[tokio::test]
    async fn a_run_keeps_within_its_budget() {
        let root = tempfile::tempdir().unwrap();
        let files: Vec<String> = (0..3)
            .map(|i| write(root.path(), &format!("{i}.png"), &png(&noise(300, 300))))
            .collect();
        let (each, total) = (40_000, 60_000);
        let shown = inliner(3, each, total).run(root.path(), &[], &files).await;
        let sizes: Vec<usize> = shown.images.iter().map(|i| i.data.len()).collect();
        assert!(sizes.iter().all(|&s| s <= each), "{sizes:?}");
        assert!(sizes.iter().sum::<usize>() <= total, "{sizes:?}");
        assert!(shown.images.len() >= 2, "the second image is shrunk into what is left");
    }

    #[tokio::test]
    async fn a_run_notes_what_it_refused_and_tries_a_bounded_number() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.png"), png(&plot(10, 10))).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.png"), root.path().join("link.png")).unwrap();
        let link = format!("{RESULTS_IN_CONTAINER}/link.png");
        let svg = write(root.path(), "chart.svg", b"<svg/>");
        let big = write(root.path(), "big.png", b"");
        std::fs::File::options()
            .write(true)
            .open(root.path().join("big.png"))
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let broken: Vec<String> = (0..8)
            .map(|i| write(root.path(), &format!("broken{i}.png"), b"\x89PNG\r\n\x1a\nbroken"))
            .collect();
        let inliner = inliner(2, 64 * 1024, 192 * 1024);

        let shown = inliner
            .run(root.path(), &[], &[link.clone(), svg.clone(), big.clone()])
            .await;
        assert!(shown.images.is_empty());
        let reasons: Vec<(&str, &str)> = shown
            .notes
            .iter()
            .map(|n| (n.path.as_str(), n.reason.as_deref().unwrap()))
            .collect();
        // The link is no regular file beneath the folder: never dated, never read.
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert_eq!(reasons[0].0, big);
        assert!(reasons[0].1.contains("only linked"), "{reasons:?}");
        assert_eq!(reasons[1], (svg.as_str(), NotInlined::Svg.to_string().as_str()));
        let read = inliner
            .image(root.path(), "link.png", 64 * 1024, later())
            .await
            .unwrap_err();
        assert_eq!(read, NotInlined::Unreadable);

        let shown = inliner.run(root.path(), &[], &broken).await;
        assert!(shown.images.is_empty());
        assert_eq!(shown.notes.len(), 4, "twice the count are tried");
    }

    #[tokio::test]
    async fn an_opened_image_is_fitted_like_a_named_one() {
        let root = tempfile::tempdir().unwrap();
        let file = write(root.path(), "wide.png", &png(&plot(3000, 1000)));
        let inliner = inliner(3, 64 * 1024, 192 * 1024);
        let opened = std::fs::File::open(root.path().join("wide.png")).unwrap();
        let shown = inliner.image_file(opened, 64 * 1024, later()).await.unwrap();
        let named = inliner.image(root.path(), &file, 64 * 1024, later()).await.unwrap();
        assert_eq!(shown.data, named.data);
        assert!(shown.data.len() <= 64 * 1024);
        assert_eq!(shown.width, MAX_SIDE);
        assert!((f64::from(shown.width) / f64::from(shown.height) - 3.0).abs() < 0.02);
    }

    #[tokio::test]
    async fn images_wait_for_a_decoder_until_their_deadline() {
        let root = tempfile::tempdir().unwrap();
        let file = write(root.path(), "a.png", &png(&plot(100, 100)));
        let inliner = inliner(3, 64 * 1024, 192 * 1024);
        let held = inliner
            .decoders
            .clone()
            .acquire_many_owned(DECODERS as u32)
            .await
            .unwrap();
        let soon = Instant::now() + Duration::from_millis(200);
        let busy = inliner.image(root.path(), &file, 64 * 1024, soon).await;
        assert_eq!(busy.unwrap_err(), NotInlined::Busy);
        drop(held);
        assert!(inliner.image(root.path(), &file, 64 * 1024, later()).await.is_ok());
    }

    #[tokio::test]
    async fn a_decode_past_its_deadline_is_abandoned_and_keeps_its_decoder_until_it_ends() {
        let root = tempfile::tempdir().unwrap();
        let file = write(root.path(), "noise.png", &png(&noise(3000, 3000)));
        let inliner = inliner(3, 64 * 1024, 192 * 1024);
        let soon = Instant::now() + Duration::from_millis(1);
        let late = inliner.image(root.path(), &file, 64 * 1024, soon).await;
        assert_eq!(late.unwrap_err(), NotInlined::Deadline);
        assert_eq!(inliner.decoders.available_permits(), DECODERS - 1, "still decoding");
        let freed = Instant::now() + Duration::from_secs(30);
        while inliner.decoders.available_permits() < DECODERS {
            assert!(Instant::now() < freed, "the abandoned decode never ended");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn inline_images_can_be_turned_off() {
        let root = tempfile::tempdir().unwrap();
        let file = write(root.path(), "a.png", &png(&plot(100, 100)));
        let off = Inliner::new(Budgets {
            enabled: false,
            ..crate::config::ResultsConfig::default().inline_budgets()
        });
        let shown = off.run(root.path(), &[], std::slice::from_ref(&file)).await;
        assert!(
            shown.images.is_empty() && shown.notes.is_empty(),
            "a run says nothing when off"
        );
        let opened = std::fs::File::open(root.path().join("a.png")).unwrap();
        assert_eq!(
            off.image_file(opened, 64 * 1024, later()).await.unwrap_err(),
            NotInlined::Off
        );
        assert_eq!(
            off.image(root.path(), &file, 64 * 1024, later()).await.unwrap_err(),
            NotInlined::Off
        );
    }
}
