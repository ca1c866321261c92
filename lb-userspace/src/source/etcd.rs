//! One configuration for several hosts, kept in etcd: the services' TOML document is the value
//! of one key (`PREFIX/config`), its version the key's modification revision, so every host
//! of a cluster applies the same revision. A change is written with a transaction that only
//! succeeds if the key is still at the revision the change was made to; each host watches the
//! key and applies every new revision. The per-host settings (`[lb]`) stay in a local file.

use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, Identity, TlsOptions, Txn, TxnOp,
    WatchOptions, WatchStream,
};

use super::{Snapshot, Version, WriteError};

/// Where the configuration is in etcd, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSource {
    /// `http://HOST:PORT` (or `https://` with a CA), one per endpoint.
    pub endpoints: Vec<String>,
    /// The key holding the document: `PREFIX/config`.
    pub key: String,
    pub tls: Option<EtcdTls>,
    /// User name and password (etcd's authentication).
    pub user: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM files: the CA that signed the servers' certificates, and the client's certificate
    /// and key when the servers ask for one.
    pub ca: std::path::PathBuf,
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// How long a request (and a connection) may take before etcd counts as unreachable.
pub const TIMEOUT: Duration = Duration::from_secs(3);

impl EtcdSource {
    /// `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`.
    pub fn parse(
        url: &str,
        tls: Option<EtcdTls>,
        user: Option<(String, String)>,
    ) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| anyhow!("{url:?}: expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX"))?;
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| anyhow!("{url:?}: no /PREFIX after the endpoints"))?;
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() {
            bail!("{url:?}: an empty PREFIX");
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| {
                if !h.contains(':') {
                    bail!("{url:?}: endpoint {h:?} has no port (etcd's is 2379)");
                }
                Ok(format!("{scheme}://{h}"))
            })
            .collect::<anyhow::Result<_>>()?;
        if endpoints.is_empty() {
            bail!("{url:?}: no endpoint");
        }
        Ok(Self {
            endpoints,
            key: format!("/{}/config", prefix.trim_start_matches('/')),
            tls,
            user,
        })
    }

    /// `etcd://HOST:PORT,.../KEY` for messages and the status.
    pub fn describe(&self) -> String {
        let hosts: Vec<&str> = self
            .endpoints
            .iter()
            .map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h))
            .collect();
        format!("etcd://{}{}", hosts.join(","), self.key)
    }

    /// A client connected to the cluster.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        let mut options = ConnectOptions::new()
            .with_timeout(TIMEOUT)
            .with_connect_timeout(TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), TIMEOUT);
        if let Some((user, password)) = &self.user {
            options = options.with_user(user, password);
        }
        if let Some(tls) = &self.tls {
            let ca = std::fs::read(&tls.ca)
                .with_context(|| format!("reading the etcd CA {}", tls.ca.display()))?;
            let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
            if let Some((cert, key)) = &tls.identity {
                let cert =
                    std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
                let key =
                    std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
                config = config.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(config);
        }
        tokio::time::timeout(TIMEOUT, Client::connect(&self.endpoints, Some(options)))
            .await
            .map_err(|_| {
                anyhow!(
                    "connecting to {}: no answer in {TIMEOUT:?}",
                    self.describe()
                )
            })?
            .with_context(|| format!("connecting to {}", self.describe()))
    }

    /// The document and its revision (None: the key does not exist: no services yet).
    pub async fn read(&self, client: &mut Client) -> anyhow::Result<Option<Snapshot>> {
        let answer = tokio::time::timeout(TIMEOUT, client.get(self.key.clone(), None))
            .await
            .map_err(|_| anyhow!("reading {}: no answer in {TIMEOUT:?}", self.describe()))?
            .with_context(|| format!("reading {}", self.describe()))?;
        let Some(kv) = answer.kvs().first() else {
            return Ok(None);
        };
        let text = kv
            .value_str()
            .map_err(|_| anyhow!("{}: the value is not UTF-8 text", self.describe()))?;
        Ok(Some(Snapshot {
            text: text.to_owned(),
            version: revision(kv.mod_revision()),
        }))
    }

    /// Puts `text` if the key is still at `expected` (a revision; "0": the key absent); the
    /// new revision.
    pub async fn replace(
        &self,
        client: &mut Client,
        expected: &Version,
        text: &str,
    ) -> Result<Version, WriteError> {
        let at: i64 = expected
            .0
            .parse()
            .map_err(|_| WriteError::Failed(anyhow!("{expected} is not an etcd revision")))?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.key.clone(),
                CompareOp::Equal,
                at,
            )])
            .and_then([TxnOp::put(self.key.clone(), text, None)])
            .or_else([TxnOp::get(self.key.clone(), None)]);
        let answer = tokio::time::timeout(TIMEOUT, client.txn(txn))
            .await
            .map_err(|_| {
                WriteError::Failed(anyhow!(
                    "writing {}: no answer in {TIMEOUT:?}",
                    self.describe()
                ))
            })?
            .map_err(|e| WriteError::Failed(anyhow!("writing {}: {e}", self.describe())))?;
        if !answer.succeeded() {
            let found = answer
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    etcd_client::TxnOpResponse::Get(g) => {
                        g.kvs().first().map(|kv| kv.mod_revision())
                    }
                    _ => None,
                })
                .unwrap_or(0);
            return Err(WriteError::Conflict {
                expected: expected.clone(),
                found: revision(found),
            });
        }
        let rev = answer
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| WriteError::Failed(anyhow!("etcd's answer has no revision")))?;
        Ok(revision(rev))
    }

    /// A watch of the key from `after` + 1 on.
    pub async fn watch(&self, client: &mut Client, after: &Version) -> anyhow::Result<WatchStream> {
        let from = after.0.parse::<i64>().unwrap_or(0) + 1;
        let (_watcher, stream) = client
            .watch(
                self.key.clone(),
                Some(WatchOptions::new().with_start_revision(from)),
            )
            .await
            .with_context(|| format!("watching {}", self.describe()))?;
        Ok(stream)
    }
}

/// A revision as a version.
pub fn revision(rev: i64) -> Version {
    Version(rev.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_endpoints_and_the_key() {
        let s =
            EtcdSource::parse("etcd://10.0.0.5:2379,10.0.0.6:2379/lb/prod/", None, None).unwrap();
        assert_eq!(
            s.endpoints,
            ["http://10.0.0.5:2379", "http://10.0.0.6:2379"]
        );
        assert_eq!(s.key, "/lb/prod/config");
        assert_eq!(
            s.describe(),
            "etcd://10.0.0.5:2379,10.0.0.6:2379/lb/prod/config"
        );
        for bad in [
            "http://x:1/p",
            "etcd://x:1",
            "etcd://x:1/",
            "etcd://x/p",
            "etcd:///p",
        ] {
            assert!(EtcdSource::parse(bad, None, None).is_err(), "{bad}");
        }
    }
}
