//! lb against an etcd that asks for TLS (a CA of the test's, client certificates required)
//! and authentication (a user allowed the key's prefix only): lb reads and watches its
//! services there and writes its API's changes there; a wrong password is refused at start
//! with the reason.

use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, Permission, TlsOptions};
use lb_tests::{
    daemon::{Daemon, Launch, TempDir},
    netns::{Netns, veth},
    require_root,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

const ADDR: &str = "127.0.0.1:2479";

/// A CA, the server's certificate (127.0.0.1) and a client's (CN lb), as PEM files in `dir`.
fn pki(dir: &std::path::Path) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "lb test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for (name, sans, cn) in [
        ("server", vec!["127.0.0.1".to_owned()], "etcd"),
        ("client", vec![], "lb"),
    ] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}-key.pem")), key.serialize_pem()).unwrap();
    }
}

/// etcd over TLS with client certificates required.
fn etcd(ns: &Netns, dir: &std::path::Path) -> lb_tests::netns::Process {
    let f = |n: &str| dir.join(n).display().to_string();
    let mut cmd = ns.command("etcd");
    cmd.args(["--name", "n1", "--data-dir", &f("data")])
        .args(["--listen-client-urls", &format!("https://{ADDR}")])
        .args(["--advertise-client-urls", &format!("https://{ADDR}")])
        .args(["--listen-peer-urls", "http://127.0.0.1:2480"])
        .args(["--initial-advertise-peer-urls", "http://127.0.0.1:2480"])
        .args(["--initial-cluster", "n1=http://127.0.0.1:2480"])
        .args([
            "--cert-file",
            &f("server.pem"),
            "--key-file",
            &f("server-key.pem"),
        ])
        .args(["--trusted-ca-file", &f("ca.pem"), "--client-cert-auth"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap());
    ns.spawn(&mut cmd).unwrap()
}

async fn client(dir: &std::path::Path, user: Option<(&str, &str)>) -> anyhow::Result<Client> {
    let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem")))
        .identity(Identity::from_pem(
            read("client.pem"),
            read("client-key.pem"),
        ));
    let mut options = ConnectOptions::new().with_tls(tls);
    if let Some((u, p)) = user {
        options = options.with_user(u, p);
    }
    Ok(Client::connect([format!("https://{ADDR}")], Some(options)).await?)
}

#[test]
fn tls_client_certificates_and_a_user_of_the_prefix() {
    require_root();
    let ns = Netns::new("etls").unwrap();
    let peer = Netns::new("etlspeer").unwrap();
    let (port, _) = veth(&ns, "10.0.2.1/24", &peer, "10.0.2.2/24").unwrap();
    ns.sysctl("net/ipv4/ip_forward", "1").unwrap();
    let dir = TempDir::new().unwrap();
    pki(&dir.0);
    let _etcd = etcd(&ns, &dir.0);
    // Users: root (to enable authentication), and lb with the key's prefix only.
    let started = Instant::now();
    ns.block_on(|| async {
        let mut c = loop {
            let last = match client(&dir.0, None).await {
                Ok(mut c) => match c.status().await {
                    Ok(_) => break c,
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "etcd over TLS does not answer: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        c.user_add("root", "rootpw", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.role_add("lb").await.unwrap();
        c.role_grant_permission("lb", Permission::read_write("/lb/tls/").with_prefix())
            .await
            .unwrap();
        c.user_add("lb", "lbpw", None).await.unwrap();
        c.user_grant_role("lb", "lb").await.unwrap();
        c.auth_enable().await.unwrap();
        let mut root = client(&dir.0, Some(("root", "rootpw"))).await.unwrap();
        root.put(
            "/lb/tls/config",
            "[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:8080\" }]\n\
             [service.check]\nkind = \"none\"\n",
            None,
        )
        .await
        .unwrap();
    });
    let f = |n: &str| dir.0.join(n).display().to_string();
    let (ca, cert, key) = (f("ca.pem"), f("client.pem"), f("client-key.pem"));
    let args = [
        "--config-source",
        "etcd://127.0.0.1:2479/lb/tls",
        "--etcd-ca",
        &ca,
        "--etcd-cert",
        &cert,
        "--etcd-key",
        &key,
        "--etcd-user",
        "lb",
    ];
    let local = format!("[lb]\ninterfaces = [\"{}\"]\n", port.ifname);
    // A wrong password: refused at start, saying why.
    let wrong = Daemon::start_with(
        &ns,
        &local,
        &Launch {
            args: &args,
            env: &[("LB_ETCD_PASSWORD", "nope")],
            ..Launch::default()
        },
    );
    let err = format!("{:#}", wrong.err().expect("started with a wrong password"));
    assert!(
        err.contains("authentication failed") || err.contains("invalid"),
        "{err}"
    );

    let d = Daemon::start_with(
        &ns,
        &local,
        &Launch {
            args: &args,
            env: &[("LB_ETCD_PASSWORD", "lbpw")],
            ..Launch::default()
        },
    )
    .unwrap();
    let s = d.status().unwrap();
    assert!(s.service("web").is_some());
    assert_eq!(s.config.unwrap().source, "etcd");
    // A change through lb's API is written there with lb's credentials.
    let out = d.lb(&["backend", "add", "web", "10.0.2.3:8080"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = ns.block_on(|| async {
        let mut root = client(&dir.0, Some(("root", "rootpw"))).await.unwrap();
        let got = root.get("/lb/tls/config", None).await.unwrap();
        got.kvs()[0].value_str().unwrap().to_owned()
    });
    assert!(value.contains("10.0.2.3:8080"), "{value}");
}
