//! What the control API serves, checked as its users see it: the status page loaded in headless
//! Chromium (the DOM after load, and a screenshot to look for the row colours), and the metrics
//! through `promtool check metrics`. Both tools come from Debian packages (`cargo xtask setup`).

use std::{
    collections::HashSet,
    io::{Read as _, Write as _},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::netns::Netns;

/// A page load takes well under a second; the first start of a cold Chromium a few.
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(60);
const PROMTOOL_TIMEOUT: Duration = Duration::from_secs(30);

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A decoded screenshot: `pixels` holds `width × height` RGB triples, row by row.
#[derive(Debug, Clone)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// The DOM of `url` after load, serialised, as headless Chromium sees it from `ns` (or from the
/// host when `None`).
pub fn chromium_dump_dom(ns: Option<&Netns>, url: &str) -> anyhow::Result<String> {
    chromium(ns, &["--dump-dom".to_owned(), url.to_owned()])
}

/// A `width × height` screenshot of `url` taken by headless Chromium from `ns` (or the host).
pub fn chromium_screenshot(
    ns: Option<&Netns>,
    url: &str,
    width: u32,
    height: u32,
) -> anyhow::Result<RgbImage> {
    let dir = TempDir::new("screenshot")?;
    let path = dir.0.join("page.png");
    chromium(
        ns,
        &[
            format!("--screenshot={}", path.display()),
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".to_owned(),
            url.to_owned(),
        ],
    )?;
    let png = std::fs::read(&path)
        .with_context(|| format!("chromium wrote no screenshot at {}", path.display()))?;
    decode_png(&png)
}

/// Pixels within `tolerance` of `rgb` on every channel.
pub fn count_colour_pixels(img: &RgbImage, rgb: [u8; 3], tolerance: u8) -> usize {
    img.pixels
        .as_chunks::<3>()
        .0
        .iter()
        .filter(|p| p.iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= tolerance))
        .count()
}

/// `promtool check metrics` on `text`: Ok when it finds nothing to complain about (parse errors
/// and lint problems both fail), else an error with what it said. Also fails on a repeated series
/// or a family whose samples are split by another family's, which promtool 2.42 (Debian 12)
/// lets through but a Prometheus scrape rejects.
pub fn promtool_check(text: &str) -> anyhow::Result<()> {
    let promtool = find_program("promtool", "prometheus")?;
    let mut cmd = Command::new(promtool);
    cmd.args(["check", "metrics"]);
    let out = run(&mut cmd, Some(text.as_bytes()), PROMTOOL_TIMEOUT)?;
    if !out.status.success() {
        bail!(
            "promtool check metrics rejected the text ({}):\n{}{}",
            out.status,
            out.stdout,
            out.stderr
        );
    }
    check_series(text)
}

/// Every series once, and each family's samples together (after its TYPE line).
fn check_series(text: &str) -> anyhow::Result<()> {
    let mut series = HashSet::new();
    let mut done: HashSet<&str> = HashSet::new();
    let mut family = "";
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap_or_default();
            done.insert(std::mem::replace(&mut family, name));
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let key = series_key(line);
        let name = &key[..key.find('{').unwrap_or(key.len())];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| *b == family))
            .unwrap_or(name);
        if base != family {
            if done.contains(base) {
                bail!("samples of {base} split by another family: {line}");
            }
            // A sample without TYPE line is a family of its own.
            done.insert(std::mem::replace(&mut family, base));
        }
        if !series.insert(key) {
            bail!("duplicate series: {line}");
        }
    }
    Ok(())
}

/// The metric name and labels of a sample line: up to the closing brace (skipping quoted label
/// values) or the first space.
fn series_key(line: &str) -> &str {
    let (mut braces, mut quoted, mut escaped) = (false, false, false);
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' if braces => quoted = !quoted,
            '{' if !quoted => braces = true,
            '}' if !quoted => return &line[..=i],
            ' ' if !braces => return &line[..i],
            _ => {}
        }
    }
    line
}

fn chromium(ns: Option<&Netns>, args: &[String]) -> anyhow::Result<String> {
    let program = find_program("chromium", "chromium")?;
    // A fresh profile per run: parallel runs must not share one (Chromium locks it), and nothing
    // cached from an earlier page may stand in for the one under test.
    let profile = TempDir::new("chromium-profile")?;
    let mut cmd = match ns {
        Some(ns) => ns.command(&program),
        None => Command::new(&program),
    };
    cmd.args([
        "--headless",
        // Root cannot use Chromium's sandbox.
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        // Paint CSS colours unchanged, so that a screenshot can be searched for them exactly.
        "--force-color-profile=srgb",
    ])
    .arg(format!("--user-data-dir={}", profile.0.display()))
    .args(args);
    let out = run(&mut cmd, None, CHROMIUM_TIMEOUT)?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            tail(&out.stderr, 2000)
        );
    }
    Ok(out.stdout)
}

/// A headless Chromium kept running on one page, driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: JSON messages ending in NUL, commands on its fd 3, replies and
/// events on its fd 4). For pages that change after load: evaluate in them, poll them, take
/// screenshots, without reloading them. Killed (with its helpers) when dropped.
pub struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    from: mpsc::Receiver<serde_json::Value>,
    next_id: u64,
    session: String,
    _profile: TempDir,
}

impl Browser {
    /// Chromium from `ns` (or the host) with a `width × height` viewport, showing `url` once
    /// loaded.
    pub fn open(ns: Option<&Netns>, url: &str, width: u32, height: u32) -> anyhow::Result<Self> {
        Self::start(ns, url, width, height, true)
    }

    /// As [`Browser::open`] with JavaScript off for the page from the start
    /// (`Emulation.setScriptExecutionDisabled`, before it loads): the page's own scripts do not
    /// run and its `<noscript>` content counts, as for a user without JavaScript. [`eval`]
    /// still works: DevTools evaluates outside the page's scripts.
    ///
    /// [`eval`]: Browser::eval
    pub fn open_without_script(
        ns: Option<&Netns>,
        url: &str,
        width: u32,
        height: u32,
    ) -> anyhow::Result<Self> {
        Self::start(ns, url, width, height, false)
    }

    fn start(
        ns: Option<&Netns>,
        url: &str,
        width: u32,
        height: u32,
        script: bool,
    ) -> anyhow::Result<Self> {
        use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
        let program = find_program("chromium", "chromium")?;
        let profile = TempDir::new("chromium-live")?;
        let pipe = || -> anyhow::Result<(OwnedFd, OwnedFd)> {
            let mut fds = [0; 2];
            // SAFETY: fds is two ints; on success both are fresh descriptors we own.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                bail!("pipe2: {}", std::io::Error::last_os_error());
            }
            // SAFETY: as above.
            Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
        };
        let (cmd_read, cmd_write) = pipe()?;
        let (out_read, out_write) = pipe()?;
        let mut cmd = match ns {
            Some(ns) => ns.command(&program),
            None => Command::new(&program),
        };
        let log = std::fs::File::create(profile.0.join("stderr.log"))?;
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--force-color-profile=srgb",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.0.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0);
        let (r, w) = (cmd_read.as_raw_fd(), out_write.as_raw_fd());
        // SAFETY: only async-signal-safe calls between fork and exec. Copied above 10 first so
        // that neither lands on 3 or 4 before both are placed; dup2 clears close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                let (r, w) = (
                    libc::fcntl(r, libc::F_DUPFD, 10),
                    libc::fcntl(w, libc::F_DUPFD, 10),
                );
                if r < 0 || w < 0 || libc::dup2(r, 3) < 0 || libc::dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        drop((cmd_read, out_write));
        let (tx, from) = mpsc::channel();
        let mut replies = std::fs::File::from(out_read);
        std::thread::spawn(move || {
            let mut pending = Vec::new();
            let mut buf = [0; 65536];
            while let Ok(n @ 1..) = replies.read(&mut buf) {
                pending.extend_from_slice(&buf[..n]);
                while let Some(end) = pending.iter().position(|&b| b == 0) {
                    let msg: Vec<u8> = pending.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice(&msg[..end])
                        && tx.send(v).is_err()
                    {
                        return;
                    }
                }
            }
        });
        let mut browser = Self {
            child,
            to: std::fs::File::from(cmd_write),
            from,
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = browser.call(
            "Target.createTarget",
            serde_json::json!({ "url": "about:blank" }),
        )?;
        let target = target["targetId"]
            .as_str()
            .context("no targetId")?
            .to_owned();
        let attached = browser.call(
            "Target.attachToTarget",
            serde_json::json!({ "targetId": target, "flatten": true }),
        )?;
        browser.session = attached["sessionId"]
            .as_str()
            .context("no sessionId")?
            .to_owned();
        browser.resize(width, height, false)?;
        if !script {
            browser.call(
                "Emulation.setScriptExecutionDisabled",
                serde_json::json!({ "value": true }),
            )?;
        }
        browser.call("Page.navigate", serde_json::json!({ "url": url }))?;
        browser.wait_for(
            &format!(
                "location.href === {} && document.readyState === 'complete'",
                serde_json::json!(url)
            ),
            CHROMIUM_TIMEOUT,
        )?;
        Ok(browser)
    }

    /// One DevTools command (to the page once attached); its `result`.
    pub fn call(
        &mut self,
        method: &str,
        params: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = serde_json::json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = self.session.clone().into();
        }
        let mut bytes = serde_json::to_vec(&msg)?;
        bytes.push(0);
        self.to
            .write_all(&bytes)
            .with_context(|| format!("sending {method} to chromium"))?;
        let deadline = Instant::now() + CHROMIUM_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self
                .from
                .recv_timeout(left)
                .with_context(|| format!("no reply to {method} from chromium"))?;
            if reply["id"].as_u64() != Some(id) {
                continue; // an event, or a reply to an earlier call given up on
            }
            if let Some(e) = reply.get("error") {
                bail!("{method}: {e}");
            }
            return Ok(reply["result"].clone());
        }
    }

    /// The value of the JavaScript expression `expr` in the page (promises awaited).
    pub fn eval(&mut self, expr: &str) -> anyhow::Result<serde_json::Value> {
        let r = self.call(
            "Runtime.evaluate",
            serde_json::json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
        )?;
        if let Some(e) = r.get("exceptionDetails") {
            bail!("{expr}: {e}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// A `width × height` viewport from now on, as a phone's when `mobile` (the page's
    /// `<meta name="viewport">` counts then); the page is laid out again, not reloaded.
    pub fn resize(&mut self, width: u32, height: u32, mobile: bool) -> anyhow::Result<()> {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            serde_json::json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile }),
        )?;
        Ok(())
    }

    /// Polls `expr` (every 50 ms) until it is truthy; its value then, or an error naming the
    /// last value after `timeout`. An error evaluating it fails at once.
    pub fn wait_for(&mut self, expr: &str, timeout: Duration) -> anyhow::Result<serde_json::Value> {
        self.poll(expr, timeout, false)
    }

    /// As [`Browser::wait_for`] on a page that reloads itself: while one document goes and the
    /// next loads there may be nothing to evaluate in, so an error counts as "not yet" (the last
    /// one is named after `timeout`).
    pub fn wait_for_across_loads(
        &mut self,
        expr: &str,
        timeout: Duration,
    ) -> anyhow::Result<serde_json::Value> {
        self.poll(expr, timeout, true)
    }

    fn poll(
        &mut self,
        expr: &str,
        timeout: Duration,
        across_loads: bool,
    ) -> anyhow::Result<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = match self.eval(expr) {
                Ok(v) => v,
                Err(e) if across_loads => {
                    if Instant::now() > deadline {
                        return Err(e.context(format!("still failing after {timeout:?}")));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let truthy = match &v {
                serde_json::Value::Null => false,
                serde_json::Value::Bool(b) => *b,
                serde_json::Value::Number(n) => n.as_f64() != Some(0.0),
                serde_json::Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("{expr}: still {v} after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A screenshot of the viewport as it is now: the PNG, and decoded.
    pub fn screenshot(&mut self) -> anyhow::Result<(Vec<u8>, RgbImage)> {
        self.capture(serde_json::json!({ "format": "png" }))
    }

    /// A screenshot of the whole page as it is now, below the viewport's end too (as wide as the
    /// viewport).
    pub fn screenshot_full_page(&mut self) -> anyhow::Result<(Vec<u8>, RgbImage)> {
        let size = self.eval(
            "[document.documentElement.clientWidth, document.documentElement.scrollHeight]",
        )?;
        let (width, height) = (&size[0], &size[1]);
        self.capture(serde_json::json!({
            "format": "png",
            "captureBeyondViewport": true,
            "clip": { "x": 0, "y": 0, "width": width, "height": height, "scale": 1 },
        }))
    }

    fn capture(&mut self, params: serde_json::Value) -> anyhow::Result<(Vec<u8>, RgbImage)> {
        let r = self.call("Page.captureScreenshot", params)?;
        let png = base64_decode(r["data"].as_str().context("no screenshot data")?)?;
        let img = decode_png(&png)?;
        Ok((png, img))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: signals only our child's process group (Chromium and its helpers).
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Standard base64 (DevTools' binary results).
fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => bail!("not base64: {:?}", c as char),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

fn decode_png(bytes: &[u8]) -> anyhow::Result<RgbImage> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    // Palette and low bit depths expanded, 16-bit stripped: 8 bits per channel from here on.
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().context("reading the PNG header")?;
    let mut buf = vec![0; reader.output_buffer_size().context("PNG too large")?];
    let info = reader.next_frame(&mut buf).context("decoding the PNG")?;
    let channels = match info.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => bail!("PNG palette not expanded"),
    };
    let (width, height) = (info.width as usize, info.height as usize);
    let mut pixels = Vec::with_capacity(width * height * 3);
    for row in buf.chunks(info.line_size).take(height) {
        for px in row.chunks_exact(channels).take(width) {
            // Screenshots are opaque: alpha is dropped.
            if channels < 3 {
                pixels.extend([px[0]; 3]);
            } else {
                pixels.extend(&px[..3]);
            }
        }
    }
    Ok(RgbImage {
        width: info.width,
        height: info.height,
        pixels,
    })
}

/// The full path of `name` in `$PATH`, or an error naming the Debian package to install.
fn find_program(name: &str, package: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{name} not found in PATH: install the Debian package `{package}` \
                 (`apt-get install -y {package}`, or `cargo xtask setup`)"
            )
        })
}

struct RunOutput {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` with `stdin` fed to it, killing it (and whatever it started) after `timeout`.
fn run(cmd: &mut Command, stdin: Option<&[u8]>, timeout: Duration) -> anyhow::Result<RunOutput> {
    let deadline = Instant::now() + timeout;
    // Its own process group, so that a timeout also ends the helpers Chromium forks.
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let pgid = child.id() as libc::pid_t;
    let kill_group = || {
        // SAFETY: signals only our child's process group.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    };
    // Readers and the writer on threads: a full pipe must not stall the child while we wait.
    let (tx, rx) = mpsc::channel();
    for (which, mut pipe) in [
        (
            0,
            Box::new(child.stdout.take().context("stdout")?) as Box<dyn std::io::Read + Send>,
        ),
        (1, Box::new(child.stderr.take().context("stderr")?)),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send((which, buf));
        });
    }
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let data = data.to_vec();
        // A child that exits without reading all of it is reported by its status instead.
        std::thread::spawn(move || pipe.write_all(&data));
    }
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the child")? {
            break status;
        }
        if Instant::now() > deadline {
            kill_group();
            let _ = child.wait();
            bail!("{cmd:?} did not finish within {timeout:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut outputs = [Vec::new(), Vec::new()];
    for _ in 0..2 {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(2));
        let (which, buf) = match rx.recv_timeout(wait) {
            Ok(got) => got,
            Err(_) => {
                // A helper that outlived the main process still holds the pipe: its group still
                // exists, so the id still names our processes.
                kill_group();
                rx.recv_timeout(Duration::from_secs(5))
                    .context("output pipes still open after the kill")?
            }
        };
        outputs[which] = buf;
    }
    let [stdout, stderr] = outputs.map(|b| String::from_utf8_lossy(&b).into_owned());
    Ok(RunOutput {
        status,
        stdout,
        stderr,
    })
}

/// The last `max` bytes of `s` (Chromium's stderr is long and the end says what went wrong).
fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// A directory removed (with its contents) when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "lb-webcheck-{}-{}-{what}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        // Left by an earlier process that had our pid and was killed.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("warning: cannot remove {}: {e}", self.0.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_pixels_within_tolerance() {
        let img = RgbImage {
            width: 3,
            height: 1,
            pixels: vec![200, 247, 197, 201, 246, 197, 0, 0, 0],
        };
        assert_eq!(count_colour_pixels(&img, [200, 247, 197], 0), 1);
        assert_eq!(count_colour_pixels(&img, [200, 247, 197], 1), 2);
    }

    #[test]
    fn decodes_rgba_png() {
        let mut png = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut png, 2, 1);
            enc.set_color(png::ColorType::Rgba);
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc.write_header().expect("header");
            w.write_image_data(&[1, 2, 3, 255, 4, 5, 6, 255])
                .expect("data");
        }
        let img = decode_png(&png).expect("decode");
        assert_eq!((img.width, img.height), (2, 1));
        assert_eq!(img.pixels, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn finds_repeated_and_split_series() {
        let ok = "# TYPE a_total counter\na_total{x=\"}\\\" \"} 1\na_total{x=\"2\"} 1\n\
                  # TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\nloose 1\n";
        check_series(ok).expect("valid");
        let repeated = format!("{ok}loose 2\n");
        assert!(check_series(&repeated).is_err());
        let split = format!("{ok}a_total{{x=\"3\"}} 1\n");
        assert!(check_series(&split).is_err());
        assert_eq!(series_key("a{x=\"} \\\"\"} 1 123"), "a{x=\"} \\\"\"}");
        assert_eq!(series_key("a 1"), "a");
    }

    #[test]
    fn missing_program_names_the_package() {
        let e = find_program("no-such-program-lb", "some-package").expect_err("found");
        assert!(format!("{e}").contains("apt-get install -y some-package"));
    }

    #[test]
    fn decodes_base64() {
        assert_eq!(base64_decode("aGVsbG8/Pz4+").unwrap(), b"hello??>>");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert!(base64_decode("a*").is_err());
    }

    #[test]
    fn tail_keeps_char_boundaries() {
        assert_eq!(tail("aé", 1), "");
        assert_eq!(tail("abc", 2), "bc");
    }
}
