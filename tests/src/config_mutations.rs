//! Mutations of a valid config file for the config fuzz test (issue 14): deleted keys and lines,
//! values of the wrong type, out-of-range, negative and huge numbers, bad durations, huge
//! strings, NUL and other control characters, unicode, duplicates, unknown keys, deep nesting,
//! non-UTF-8 bytes, truncations and byte flips. Every case is text a user (or a broken tool)
//! could write; the reader must answer each with a config or problems, never a panic or a hang.

use crate::rng::Rng;

/// A valid config using every section and most keys.
pub const BASE: &str = r#"[lb]
interfaces = ["eth1", "eth2"]
xdp_mode = "auto"
api = "127.0.0.1:9090"
api_token = "0123456789abcdef0123"
pin_path = "/sys/fs/bpf/lb"
snat_address = "10.0.2.1"
snat_ports = "1024-32767"
ring_size = 65537
max_services = 64
max_backends = 4096
conntrack = { size = 1048576, tcp_syn_timeout = "30s", tcp_established_timeout = "15m", tcp_closing_timeout = "10s", tcp_closed_timeout = "1s", udp_timeout = "60s" }

[lb.announce]
table = 200
grace = "5s"

[[service]]
name = "web"
vip = "10.100.0.1:80"
protocol = "tcp"
announce = "healthy"
announce_min_available = 1
snat_address = "10.0.2.1"
existing_flows = "reschedule"
on_all_unhealthy = "use-all"
backends = [
  { address = "10.0.2.2:8080", weight = 1 },
  { address = "10.0.3.2:8080", weight = 2 },
]

[service.check]
kind = "http"
port = 8081
timeout = "2s"
interval = "2s"
unhealthy_interval = "3s"
healthy_threshold = 3
unhealthy_threshold = 3
method = "GET"
path = "/health"
host = "example.com"
headers = { X-Check = "lb" }
status = [200, "300-302"]

[service.passive]
enabled = true
failures = 10
window = "120s"
ejection = "60s"
traffic_triggered = false
traffic_idle = "30m"

[[service]]
name = "dns"
vip = "10.100.0.1:53"
protocol = "udp"
announce = "always"
backends = [{ address = "10.0.2.2:53" }, { address = "10.0.3.2:53", weight = 0 }]

[service.check]
kind = "udp"
send = "PING"
expect = "PONG"
timeout = "500ms"
interval = "1s"

[[service]]
name = "secure"
vip = "10.100.0.2:443"
backends = [{ address = "10.0.4.2:443" }]
on_all_unhealthy = "first"
existing_flows = "keep"

[service.check]
kind = "https"
verify_tls = false

[[service]]
name = "dsr"
vip = "10.100.0.3:80"
forwarding = "gue"
backends = [{ address = "10.0.5.2:80" }]

[service.check]
kind = "tcp-connect"
through_tunnel = true
"#;

/// Values to put where another value was: every TOML type, and edge values of each.
fn values(rng: &mut Rng) -> String {
    let huge = "x".repeat(rng.pick(&[1 << 10, 1 << 16, 1 << 20]).to_owned());
    let pool: Vec<String> = vec![
        "0".into(),
        "1".into(),
        "-1".into(),
        "65536".into(),
        "4294967296".into(),
        "9223372036854775807".into(),
        "-9223372036854775808".into(),
        "99999999999999999999".into(),
        "1.5".into(),
        "-0.0".into(),
        "1e308".into(),
        "nan".into(),
        "inf".into(),
        "-inf".into(),
        "0x7fffffff".into(),
        "0o777".into(),
        "0b1".into(),
        "true".into(),
        "false".into(),
        "\"\"".into(),
        "\"x\"".into(),
        format!("\"{huge}\""),
        "\"\\u0000\"".into(),
        "\"a\\u0000b\"".into(),
        "\"\\u001b[31m\"".into(),
        "\"\\r\\n\"".into(),
        "\"\\t\"".into(),
        "\"\\u202e\\u200b\"".into(),
        "\"ünïcödé 🎉\"".into(),
        "\"١٢٣s\"".into(),
        "\"99999999999999999999s\"".into(),
        "\"18446744073709551616s\"".into(),
        "\"99999999999999999999999999999999999999999d\"".into(),
        "\"1e9s\"".into(),
        "\"-1s\"".into(),
        "\"0s\"".into(),
        "\"0.0000000001ms\"".into(),
        "\"1.2.3s\"".into(),
        "\".s\"".into(),
        "\"5 s\"".into(),
        "\"NaNs\"".into(),
        "\"infh\"".into(),
        "\"10.0.0.1:99999999999\"".into(),
        "\"10.0.0.1:-1\"".into(),
        "\"10.0.0.1:0\"".into(),
        "\"127.0.0.1:80\"".into(),
        "\"0.0.0.0:80\"".into(),
        "\"255.255.255.255:80\"".into(),
        "\"224.0.0.1:80\"".into(),
        "\"[::1]:80\"".into(),
        "\"[fe80::1%eth0]:80\"".into(),
        "\"10.100.0.1:8080\"".into(),
        "\"1-0\"".into(),
        "\"0-65535\"".into(),
        "\"65535-65535\"".into(),
        "\"/sys/fs/bpf/../../etc\"".into(),
        "\"/sys/fs/bpf//x\"".into(),
        "[]".into(),
        "[1, \"a\"]".into(),
        "[[], [[]]]".into(),
        format!("[{}]", vec!["\"e\""; 300].join(", ")),
        "{}".into(),
        "{ a = 1 }".into(),
        "{ address = \"10.0.9.9:80\" }".into(),
        "1979-05-27T07:32:00Z".into(),
        "07:32:00".into(),
        "1979-05-27".into(),
    ];
    rng.pick(&pool).clone()
}

/// `[[[…]]]` or `{ a = { a = … } }` `depth` deep.
fn nested(rng: &mut Rng) -> String {
    let depth = *rng.pick(&[10, 100, 1000, 10_000]);
    if rng.chance(2) {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    } else {
        format!("{}1{}", "{ a = ".repeat(depth), " }".repeat(depth))
    }
}

/// One mutation of `text` (bytes: some mutations make it invalid UTF-8).
fn mutate_once(rng: &mut Rng, text: &mut Vec<u8>) {
    let lines =
        |text: &[u8]| -> Vec<Vec<u8>> { text.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect() };
    let join = |lines: Vec<Vec<u8>>| lines.join(&b'\n');
    match rng.below(14) {
        // A line goes (deleted keys, tables, closing brackets).
        0 => {
            let mut l = lines(text);
            if !l.is_empty() {
                let i = rng.below(l.len());
                l.remove(i);
            }
            *text = join(l);
        }
        // A value of another type, or an edge value.
        1..=3 => {
            let mut l = lines(text);
            let keyed: Vec<usize> = (0..l.len())
                .filter(|&i| l[i].windows(3).any(|w| w == b" = "))
                .collect();
            if !keyed.is_empty() {
                let i = *rng.pick(&keyed);
                let eq = l[i].windows(3).position(|w| w == b" = ").unwrap_or(0);
                let mut line = l[i][..eq + 3].to_vec();
                line.extend_from_slice(values(rng).as_bytes());
                l[i] = line;
            }
            *text = join(l);
        }
        // A line repeated (duplicate keys and tables).
        4 => {
            let mut l = lines(text);
            if !l.is_empty() {
                let i = rng.below(l.len());
                let copy = l[i].clone();
                l.insert(i, copy);
            }
            *text = join(l);
        }
        // An unknown key, or a known one in the wrong table.
        5 => {
            let mut l = lines(text);
            let key = rng.pick(&[
                "colour = 1",
                "kind = \"tcp\"",
                "interfaces = [\"x\"]",
                "backends = []",
                "vip = \"10.100.0.9:1\"",
                "\"\" = 1",
                "\"\\u0000\" = 1",
                "a.b.c = 1",
            ]);
            let i = rng.below(l.len() + 1);
            l.insert(i, key.as_bytes().to_vec());
            *text = join(l);
        }
        // Deep nesting as a value.
        6 => {
            let mut l = lines(text);
            let i = rng.below(l.len() + 1);
            l.insert(i, format!("deep = {}", nested(rng)).into_bytes());
            *text = join(l);
        }
        // A table header in a random place.
        7 => {
            let mut l = lines(text);
            let header = rng.pick(&[
                "[lb]",
                "[[service]]",
                "[service.check]",
                "[service.passive]",
                "[service]",
                "[[lb]]",
                "[[service.backends]]",
                "[service.check.headers]",
            ]);
            let i = rng.below(l.len() + 1);
            l.insert(i, header.as_bytes().to_vec());
            *text = join(l);
        }
        // Bytes that are not UTF-8.
        8 => {
            let i = rng.below(text.len() + 1);
            let bad: &[u8] = rng.pick(&[
                &b"\xff"[..],
                b"\xc3",
                b"\xe2\x82",
                b"\xed\xa0\x80",
                b"\xc0\xaf",
            ]);
            text.splice(i..i, bad.iter().copied());
        }
        // Cut at any byte.
        9 => {
            let i = rng.below(text.len() + 1);
            text.truncate(i);
        }
        // A few bytes flipped.
        10 => {
            for _ in 0..=rng.below(4) {
                if text.is_empty() {
                    break;
                }
                let i = rng.below(text.len());
                text[i] = rng.byte();
            }
        }
        // NUL and control characters inside a string.
        11 => {
            let quotes: Vec<usize> = (0..text.len()).filter(|&i| text[i] == b'"').collect();
            if !quotes.is_empty() {
                let i = *rng.pick(&quotes) + 1;
                let c: &[u8] = rng.pick(&[
                    &b"\\u0000"[..],
                    b"\x00",
                    b"\x01",
                    b"\x1b",
                    b"\x7f",
                    b"\t",
                    b"\\u2028",
                ]);
                text.splice(i..i, c.iter().copied());
            }
        }
        // A number anywhere made huge or negative.
        12 => {
            let digits: Vec<usize> = (0..text.len())
                .filter(|&i| text[i].is_ascii_digit())
                .collect();
            if !digits.is_empty() {
                let i = *rng.pick(&digits);
                let what: &[u8] = rng.pick(&[
                    &b"99999999999999999999"[..],
                    b"-",
                    b"0",
                    b"18446744073709551615",
                    b".",
                ]);
                text.splice(i..i, what.iter().copied());
            }
        }
        // Many copies of the first service (more than max_services, duplicate names and VIPs).
        _ => {
            let find = |from: usize, text: &[u8]| {
                text.get(from..)?
                    .windows(11)
                    .position(|w| w == b"[[service]]")
                    .map(|i| i + from)
            };
            if let Some(start) = find(0, text) {
                let end = find(start + 1, text).unwrap_or(text.len());
                let block = text[start..end].to_vec();
                for _ in 0..rng.below(70) {
                    text.push(b'\n');
                    text.extend_from_slice(&block);
                }
            }
        }
    }
}

/// A mutated config: one to three mutations of [`BASE`].
pub fn mutated(rng: &mut Rng) -> Vec<u8> {
    let mut text = BASE.as_bytes().to_vec();
    for _ in 0..=rng.below(3) {
        mutate_once(rng, &mut text);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_valid_and_mutations_differ() {
        lb::config::parse(BASE).unwrap();
        let mut rng = Rng::new(7);
        let changed = (0..200)
            .filter(|_| mutated(&mut rng) != BASE.as_bytes())
            .count();
        assert!(changed > 150, "{changed} of 200 mutations changed the text");
    }
}
