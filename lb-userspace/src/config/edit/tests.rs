use serde_json::json;

use super::*;

/// A hand-written file: comments, blank lines, aligned values, both forms of `backends`.
const FILE: &str = r#"# lb's configuration: comments stay where they are
[lb]
interfaces = ["eth1"]   # the NIC facing clients and backends

# The web service.
[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [
    { address = "10.0.2.10:8080", weight = 1 },  # the old one
    { address = "10.0.2.11:8080", weight = 2 },
]

[service.check]
kind = "http"      # GET /healthz
path = "/healthz"

# DNS, on one line
[[service]]
name = "dns"
vip = "10.100.0.1:53"
protocol = "udp"
backends = [{ address = "10.0.2.10:53" }]

[[service]]
name = "mail"
vip = "10.100.0.1:25"

[[service.backends]]
address = "10.0.2.20:25"   # relay
weight = 1
"#;

fn edited(changes: &[Change]) -> String {
    let mut doc = Document::parse(FILE).unwrap();
    for c in changes {
        doc.apply(c).unwrap();
    }
    let text = doc.text();
    // Every result here is a valid configuration too.
    crate::config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    text
}

/// `text` is `FILE` with `old` replaced by `new` (each once), and nothing else changed.
fn assert_only(text: &str, edits: &[(&str, &str)]) {
    let mut want = FILE.to_owned();
    for (old, new) in edits {
        assert_eq!(want.matches(old).count(), 1, "{old:?} is not once in FILE");
        want = want.replacen(old, new, 1);
    }
    assert_eq!(text, want);
}

fn put_backend(service: &str, backend: &str, body: Json) -> Change {
    Change::PutBackend {
        service: service.into(),
        backend: backend.into(),
        body,
        create_only: false,
    }
}

#[test]
fn an_unchanged_document_is_the_file_byte_for_byte() {
    assert_eq!(Document::parse(FILE).unwrap().text(), FILE);
}

#[test]
fn a_backend_added_takes_a_line_of_its_own_in_a_multiline_array() {
    let text = edited(&[put_backend("web", "10.0.2.12:8080", json!({"weight": 3}))]);
    assert_only(
        &text,
        &[(
            "    { address = \"10.0.2.11:8080\", weight = 2 },\n",
            "    { address = \"10.0.2.11:8080\", weight = 2 },\n    { address = \"10.0.2.12:8080\", weight = 3 },\n",
        )],
    );
}

#[test]
fn a_backend_added_to_a_one_line_array_stays_on_the_line() {
    let text = edited(&[put_backend("dns", "10.0.2.11:53", json!({}))]);
    assert_only(
        &text,
        &[(
            "backends = [{ address = \"10.0.2.10:53\" }]",
            "backends = [{ address = \"10.0.2.10:53\" }, { address = \"10.0.2.11:53\" }]",
        )],
    );
}

#[test]
fn a_backend_added_to_backend_tables_is_a_table() {
    let text = edited(&[put_backend("mail", "10.0.2.21:25", json!({"weight": 2}))]);
    assert_only(
        &text,
        &[(
            "weight = 1\n",
            "weight = 1\n\n[[service.backends]]\naddress = \"10.0.2.21:25\"\nweight = 2\n",
        )],
    );
}

#[test]
fn a_backends_weight_changes_in_place_keeping_its_comment() {
    // The address may be written otherwise than in the file: it is compared as an address.
    let text = edited(&[put_backend("web", "10.0.2.10:8080", json!({"weight": 5}))]);
    assert_only(
        &text,
        &[(
            "{ address = \"10.0.2.10:8080\", weight = 1 },  # the old one",
            "{ address = \"10.0.2.10:8080\", weight = 5 },  # the old one",
        )],
    );
    let text = edited(&[put_backend("mail", "10.0.2.20:25", json!({"weight": 4}))]);
    assert_only(&text, &[("weight = 1\n", "weight = 4\n")]);
}

#[test]
fn a_put_backend_is_the_whole_backend_keys_left_out_go() {
    let text = edited(&[put_backend("web", "10.0.2.11:8080", json!({}))]);
    assert_only(
        &text,
        &[(
            "{ address = \"10.0.2.11:8080\", weight = 2 }",
            "{ address = \"10.0.2.11:8080\" }",
        )],
    );
}

#[test]
fn a_backend_deleted_leaves_the_others_as_they_were() {
    let del = |s: &str, b: &str| Change::DeleteBackend {
        service: s.into(),
        backend: b.into(),
    };
    let text = edited(&[del("web", "10.0.2.11:8080")]);
    assert_only(
        &text,
        &[("    { address = \"10.0.2.11:8080\", weight = 2 },\n", "")],
    );
    let text = edited(&[del("web", "10.0.2.10:8080")]);
    assert_only(
        &text,
        &[(
            "    { address = \"10.0.2.10:8080\", weight = 1 },  # the old one\n",
            "",
        )],
    );
}

#[test]
fn a_service_added_goes_at_the_end_with_its_tables() {
    let body = json!({
        "vip": "10.100.0.2:443",
        "backends": [{"address": "10.0.2.30:443", "weight": 1}, {"address": "10.0.2.31:443"}],
        "check": {"kind": "tcp", "interval": "1s", "timeout": "500ms"},
        "protocol": "tcp",
    });
    let text = edited(&[Change::PutService {
        service: "tls".into(),
        body,
        create_only: true,
    }]);
    let added = "\n[[service]]\nname = \"tls\"\nvip = \"10.100.0.2:443\"\nprotocol = \"tcp\"\n\
                 backends = [\n    { address = \"10.0.2.30:443\", weight = 1 },\n    \
                 { address = \"10.0.2.31:443\" },\n]\n\n[service.check]\nkind = \"tcp\"\n\
                 interval = \"1s\"\ntimeout = \"500ms\"\n";
    assert_eq!(text, format!("{FILE}{added}"));
}

#[test]
fn a_service_replaced_keeps_its_place_and_the_comment_above_it() {
    let body = json!({"vip": "10.100.0.1:53", "protocol": "udp",
                      "backends": [{"address": "10.0.2.12:53"}]});
    let text = edited(&[Change::PutService {
        service: "dns".into(),
        body,
        create_only: false,
    }]);
    assert_only(
        &text,
        &[(
            "backends = [{ address = \"10.0.2.10:53\" }]\n",
            "backends = [\n    { address = \"10.0.2.12:53\" },\n]\n",
        )],
    );
}

#[test]
fn a_service_deleted_goes_with_its_tables_and_comments() {
    let text = edited(&[Change::DeleteService {
        service: "web".into(),
    }]);
    let start = FILE.find("# The web service.").unwrap();
    let end = FILE.find("# DNS").unwrap();
    assert_eq!(text, format!("{}{}", &FILE[..start], &FILE[end..]));
}

#[test]
fn what_cannot_be_done_is_refused_and_changes_nothing() {
    let mut doc = Document::parse(FILE).unwrap();
    let cases = [
        (
            Change::DeleteService {
                service: "nope".into(),
            },
            EditError::NotFound("no service \"nope\"".into()),
        ),
        (
            Change::DeleteBackend {
                service: "web".into(),
                backend: "10.0.2.99:80".into(),
            },
            EditError::NotFound("service \"web\" has no backend 10.0.2.99:80".into()),
        ),
        (
            Change::PutService {
                service: "web".into(),
                body: json!({}),
                create_only: true,
            },
            EditError::Exists("service \"web\" exists already".into()),
        ),
        (
            Change::PutBackend {
                service: "web".into(),
                backend: "10.0.2.10:8080".into(),
                body: json!({}),
                create_only: true,
            },
            EditError::Exists("service \"web\" has a backend 10.0.2.10:8080 already".into()),
        ),
    ];
    for (change, want) in cases {
        assert_eq!(doc.apply(&change), Err(want));
    }
    let invalid = [
        put_backend("web", "10.0.2.12", json!({})),
        put_backend("web", "10.0.2.12:80", json!([1])),
        put_backend("web", "10.0.2.12:80", json!({"weight": null})),
        put_backend("web", "10.0.2.12:80", json!({"address": "10.0.2.13:80"})),
        put_backend(
            "web",
            "10.0.2.12:80",
            json!({"weight": 18446744073709551615u64}),
        ),
        Change::PutService {
            service: "x".into(),
            body: json!({"name": "y"}),
            create_only: false,
        },
        Change::PutService {
            service: "x".into(),
            body: json!("vip"),
            create_only: false,
        },
    ];
    for change in invalid {
        assert!(
            matches!(doc.apply(&change), Err(EditError::Invalid(_))),
            "{change:?}"
        );
    }
    assert_eq!(doc.text(), FILE);
}

#[test]
fn changes_come_as_json() {
    let batch: Vec<Change> = serde_json::from_value(json!([
        {"op": "put_backend", "service": "web", "backend": "10.0.2.12:8080", "body": {"weight": 2}},
        {"op": "delete_backend", "service": "web", "backend": "10.0.2.10:8080"},
        {"op": "delete_service", "service": "dns"},
        {"op": "put_service", "service": "s", "body": {}, "create_only": true},
    ]))
    .unwrap();
    assert_eq!(batch.len(), 4);
    assert!(
        serde_json::from_value::<Change>(json!({"op": "put_backend", "service": "web"})).is_err()
    );
    assert!(
        serde_json::from_value::<Change>(json!({"op": "drop_table", "service": "web"})).is_err()
    );
}

#[test]
fn a_comment_after_the_last_entry_stays_on_its_line() {
    let file = "[lb]\ninterfaces = [\"eth1\"]\n\n[[service]]\nname = \"s\"\nvip = \"10.100.0.1:80\"\n\
                backends = [\n  { address = \"10.0.2.1:80\" },  # one\n  \
                { address = \"10.0.2.2:80\" }  # two, no comma\n]\n";
    let mut doc = Document::parse(file).unwrap();
    doc.apply(&put_backend("s", "10.0.2.3:80", json!({})))
        .unwrap();
    assert_eq!(
        doc.text(),
        file.replace(
            "# two, no comma\n",
            "# two, no comma\n  { address = \"10.0.2.3:80\" },\n"
        )
        .replace("\"10.0.2.2:80\" }  #", "\"10.0.2.2:80\" },  #")
    );
    let del = |b: &str| Change::DeleteBackend {
        service: "s".into(),
        backend: b.into(),
    };
    doc.apply(&del("10.0.2.3:80")).unwrap();
    doc.apply(&del("10.0.2.2:80")).unwrap();
    assert_eq!(
        doc.text(),
        "[lb]\ninterfaces = [\"eth1\"]\n\n[[service]]\nname = \"s\"\nvip = \"10.100.0.1:80\"\n\
         backends = [\n  { address = \"10.0.2.1:80\" },  # one\n]\n"
    );
}

#[test]
fn backends_from_dns_are_written_after_the_files_own() {
    let backend = |a: &str, weight| crate::config::Backend {
        address: a.parse().unwrap(),
        weight,
        server_id: None,
    };
    let found = [
        (
            "web".to_owned(),
            // One the file has already (left out), one new.
            vec![backend("10.0.2.10:8080", 1), backend("10.0.2.12:8080", 2)],
        ),
        ("gone".to_owned(), vec![backend("10.0.9.9:80", 1)]),
        ("dns".to_owned(), vec![backend("10.0.2.11:53", 1)]),
    ];
    let (text, appended) = with_discovered(FILE, &found).unwrap();
    assert_only(
        &text,
        &[
            (
                "    { address = \"10.0.2.11:8080\", weight = 2 },\n",
                "    { address = \"10.0.2.11:8080\", weight = 2 },\n    { address = \"10.0.2.12:8080\", weight = 2 },\n",
            ),
            (
                "backends = [{ address = \"10.0.2.10:53\" }]",
                "backends = [{ address = \"10.0.2.10:53\" }, { address = \"10.0.2.11:53\", weight = 1 }]",
            ),
        ],
    );
    let at: Vec<_> = appended
        .iter()
        .map(|a| (a.service.as_str(), a.at))
        .collect();
    assert_eq!(at, [("web", (0, 2)), ("dns", (1, 1))]);
}
