//! `--store` URLs: `redis://[USER[:PASSWORD]@]HOST:PORT[/DB]`, the same
//! with `rediss://` for TLS, `redis+cluster://` / `rediss+cluster://` for
//! one node of a Redis Cluster (the client finds the others from it), and
//! `redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER[/DB]` for the master
//! that Redis Sentinels name (`rediss+sentinel://`: TLS to the sentinels
//! and to the master).
//! Parsed here (not by the client) so that every error and every log line
//! shows the URL with its password redacted.

use std::fmt;

/// What replaces a password wherever a URL is shown.
const REDACTED: &str = "***";

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct StoreUrl {
    /// `rediss://`: TLS, with the server certificate checked against the
    /// system's roots.
    pub(crate) tls: bool,
    /// What the host names: one server, a cluster node, or a sentinel.
    pub(crate) topology: Topology,
    /// Host name or address (IPv6 without brackets).
    pub(crate) host: String,
    /// TCP port.
    pub(crate) port: u16,
    /// Logical database (0 unless given).
    pub(crate) db: i64,
    /// ACL user name, if the URL names one.
    pub(crate) username: Option<String>,
    /// Password from the URL; `--store-password-file` and
    /// `SLUICE_STORE_PASSWORD` take precedence.
    pub(crate) password: Option<String>,
}

/// What a store URL's host is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// `redis://`, `rediss://`: the server itself.
    Single,
    /// `redis+cluster://`, `rediss+cluster://`: one node of a Redis
    /// Cluster; the client finds the others from it.
    Cluster,
    /// `redis+sentinel://`, `rediss+sentinel://`: a Redis Sentinel (the
    /// first of several) that names the current master of `service`; the
    /// credentials and the database are the master's (the sentinels' own
    /// password is `--store-sentinel-password-file`).
    Sentinel {
        /// The master's name in the sentinels' configuration.
        service: String,
        /// The other sentinels, tried in order when one does not answer.
        more_sentinels: Vec<(String, u16)>,
    },
}

/// Why a `--store` URL does not parse; shown with the redacted URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store URL {url}: {reason}")]
pub struct UrlError {
    /// The URL as given, its password redacted.
    pub(crate) url: String,
    /// What is wrong.
    pub(crate) reason: &'static str,
}

/// The schemes, whether they use TLS, and what their host is.
const SCHEMES: [(&str, bool, Kind); 6] = [
    ("redis://", false, Kind::Single),
    ("rediss://", true, Kind::Single),
    ("redis+cluster://", false, Kind::Cluster),
    ("rediss+cluster://", true, Kind::Cluster),
    ("redis+sentinel://", false, Kind::Sentinel),
    ("rediss+sentinel://", true, Kind::Sentinel),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Single,
    Cluster,
    Sentinel,
}

impl StoreUrl {
    /// Parses `text`.
    pub(crate) fn parse(text: &str) -> Result<Self, UrlError> {
        let fail = |reason| UrlError {
            url: redact(text),
            reason,
        };
        let Some((tls, kind, rest)) = SCHEMES.iter().find_map(|(scheme, tls, kind)| {
            text.strip_prefix(scheme).map(|rest| (*tls, *kind, rest))
        }) else {
            return Err(fail(
                "expected redis://HOST:PORT[/DB], rediss://HOST:PORT[/DB], \
                 redis+cluster://HOST:PORT, rediss+cluster://HOST:PORT or \
                 redis[s]+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]",
            ));
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password.to_owned())),
                    None => (userinfo, None),
                };
                ((!user.is_empty()).then(|| user.to_owned()), password)
            }
        };
        let mut hosts = hosts
            .split(',')
            .map(|hostport| host_and_port(hostport).map_err(fail))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter();
        let Some((host, port)) = hosts.next() else {
            return Err(fail("expected HOST:PORT (the port is required)"));
        };
        let more_hosts: Vec<(String, u16)> = hosts.collect();
        if kind != Kind::Sentinel && !more_hosts.is_empty() {
            return Err(fail("several hosts are for redis+sentinel:// only"));
        }
        let (service, db_text) = if kind == Kind::Sentinel {
            let (service, db) = path.split_once('/').unwrap_or((path, ""));
            if service.is_empty() {
                return Err(fail("expected /MASTER, the master's name in the sentinels"));
            }
            (Some(service.to_owned()), db)
        } else {
            (None, path)
        };
        let db = if db_text.is_empty() {
            0
        } else {
            db_text
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| fail("the database after / is not a number"))?
        };
        let topology = match (kind, service) {
            (Kind::Cluster, _) if db != 0 => {
                return Err(fail("a Redis Cluster has only database 0"));
            }
            (Kind::Cluster, _) => Topology::Cluster,
            (Kind::Sentinel, Some(service)) => Topology::Sentinel {
                service,
                more_sentinels: more_hosts,
            },
            _ => Topology::Single,
        };
        Ok(Self {
            tls,
            topology,
            host,
            port,
            db,
            username,
            password,
        })
    }

    /// Whether it names a Redis Cluster node.
    pub(crate) fn is_cluster(&self) -> bool {
        self.topology == Topology::Cluster
    }

    fn scheme(&self) -> &'static str {
        match (self.tls, &self.topology) {
            (false, Topology::Single) => "redis",
            (true, Topology::Single) => "rediss",
            (false, Topology::Cluster) => "redis+cluster",
            (true, Topology::Cluster) => "rediss+cluster",
            (false, Topology::Sentinel { .. }) => "redis+sentinel",
            (true, Topology::Sentinel { .. }) => "rediss+sentinel",
        }
    }

    /// The URL without any credentials, for the client library (which is
    /// handed the credentials separately): the server, or the first
    /// sentinel.
    pub(crate) fn without_credentials(&self) -> String {
        format!(
            "{}://{}:{}/{}",
            if self.tls { "rediss" } else { "redis" },
            bracket(&self.host),
            self.port,
            match self.topology {
                Topology::Sentinel { .. } => 0,
                _ => self.db,
            }
        )
    }

    /// Every sentinel's host and port, in order; empty unless
    /// [`Topology::Sentinel`].
    pub(crate) fn sentinels(&self) -> Vec<(String, u16)> {
        let Topology::Sentinel { more_sentinels, .. } = &self.topology else {
            return Vec::new();
        };
        std::iter::once((self.host.clone(), self.port))
            .chain(more_sentinels.iter().cloned())
            .collect()
    }
}

/// `HOST:PORT` or `[IPv6]:PORT`.
fn host_and_port(hostport: &str) -> Result<(String, u16), &'static str> {
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        bracketed.split_once("]:").ok_or("expected [IPv6]:PORT")?
    } else {
        hostport
            .rsplit_once(':')
            .ok_or("expected HOST:PORT (the port is required)")?
    };
    if host.is_empty() || host.contains(['/', '?', '#', ' ']) {
        return Err("the host is empty or not a host name");
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or("the port is not a number from 1 to 65535")?;
    Ok((host.to_owned(), port))
}

/// Shows the URL with its password redacted.
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme())?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:{REDACTED}@")?,
            (None, Some(_)) => write!(f, ":{REDACTED}@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, None) => {}
        }
        write!(f, "{}:{}", bracket(&self.host), self.port)?;
        if let Topology::Sentinel {
            service,
            more_sentinels,
        } = &self.topology
        {
            for (host, port) in more_sentinels {
                write!(f, ",{}:{port}", bracket(host))?;
            }
            write!(f, "/{service}")?;
        }
        write!(f, "/{}", self.db)
    }
}

/// Debug is Display: a password must not reach a log through `{:?}`.
impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// `text` with whatever sits between `://…:` and `@` replaced, for URLs
/// that did not parse (best effort: nothing after the last `@` is secret).
pub(crate) fn redact(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        // Not a URL at all: it may still be a mistyped secret.
        return if text.contains('@') {
            REDACTED.to_owned()
        } else {
            text.to_owned()
        };
    };
    match rest.rsplit_once('@') {
        Some((userinfo, hostpart)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:{REDACTED}@{hostpart}"),
            None => format!("{scheme}://{userinfo}@{hostpart}"),
        },
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_host_port_db_and_tls() {
        let url = StoreUrl::parse("redis://127.0.0.1:6379/2").unwrap();
        assert_eq!(
            (url.tls, url.host.as_str(), url.port, url.db),
            (false, "127.0.0.1", 6379, 2)
        );
        assert_eq!(url.to_string(), "redis://127.0.0.1:6379/2");
        let url = StoreUrl::parse("rediss://cache.internal:6380").unwrap();
        assert!(url.tls);
        assert_eq!(url.db, 0);
        assert_eq!(url.without_credentials(), "rediss://cache.internal:6380/0");
        let url = StoreUrl::parse("redis://[::1]:7000").unwrap();
        assert_eq!(url.host, "::1");
        assert_eq!(url.to_string(), "redis://[::1]:7000/0");
    }

    #[test]
    fn cluster_urls_name_one_node_of_database_0() {
        let url = StoreUrl::parse("redis+cluster://10.0.0.1:7000").unwrap();
        assert!(url.is_cluster() && !url.tls);
        assert_eq!(url.to_string(), "redis+cluster://10.0.0.1:7000/0");
        assert_eq!(url.without_credentials(), "redis://10.0.0.1:7000/0");
        let url = StoreUrl::parse("rediss+cluster://u:pw@cache:7000/0").unwrap();
        assert!(url.is_cluster() && url.tls);
        assert_eq!(url.to_string(), "rediss+cluster://u:***@cache:7000/0");
        let err = StoreUrl::parse("redis+cluster://:pw@h:7000/3").unwrap_err();
        assert_eq!(err.reason, "a Redis Cluster has only database 0");
        assert!(!err.to_string().contains("pw@"), "{err}");
        assert!(StoreUrl::parse("redis+sentinel://h:1").is_err());
        assert!(StoreUrl::parse("redis://h:1,h:2").is_err());
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let url = StoreUrl::parse("redis+sentinel://:pw@s1:26379,[::1]:26380/main/2").unwrap();
        assert_eq!(
            url.topology,
            Topology::Sentinel {
                service: "main".to_owned(),
                more_sentinels: vec![("::1".to_owned(), 26380)],
            }
        );
        assert_eq!(url.db, 2);
        assert_eq!(
            url.to_string(),
            "redis+sentinel://:***@s1:26379,[::1]:26380/main/2"
        );
        assert!(!url.tls);
        assert_eq!(
            url.sentinels(),
            [("s1".to_owned(), 26379), ("::1".to_owned(), 26380)]
        );
        let tls = StoreUrl::parse("rediss+sentinel://s1:26379/main").unwrap();
        assert!(tls.tls);
        assert_eq!(tls.to_string(), "rediss+sentinel://s1:26379/main/0");
        let err = StoreUrl::parse("redis+sentinel://s1:26379").unwrap_err();
        assert!(err.reason.contains("/MASTER"), "{err}");
        let err = StoreUrl::parse("redis+sentinel://s1:26379,s2/main").unwrap_err();
        assert!(err.reason.contains("HOST:PORT"), "{err}");
    }

    #[test]
    fn passwords_never_show() {
        let url = StoreUrl::parse("redis://sluice:hunter2@h:1/0").unwrap();
        assert_eq!(url.username.as_deref(), Some("sluice"));
        assert_eq!(url.password.as_deref(), Some("hunter2"));
        for shown in [
            url.to_string(),
            format!("{url:?}"),
            url.without_credentials(),
        ] {
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        assert_eq!(url.to_string(), "redis://sluice:***@h:1/0");
        let url = StoreUrl::parse("redis://:hunter2@h:1").unwrap();
        assert_eq!(url.to_string(), "redis://:***@h:1/0");
        // A URL that does not parse is redacted in its error too.
        let err = StoreUrl::parse("redis://u:hunter2@h").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(err.to_string().contains("redis://u:***@h"), "{err}");
    }

    #[test]
    fn refuses_what_is_not_a_store_url() {
        for bad in [
            "localhost:6379",
            "http://h:1",
            "redis://h",
            "redis://h:0",
            "redis://h:99999",
            "redis://:6379",
            "redis://h:1/x",
            "redis://h:1/-1",
            "redis://[::1]",
        ] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad}");
        }
    }
}

/// `store:` in a limits file: a URL that parses, kept as written (it may
/// hold a password, so it is shown only through [`StoreUrl`]'s redaction).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct StoreSetting(String);

impl StoreSetting {
    /// The URL as written.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for StoreSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

impl serde::Serialize for StoreSetting {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for StoreSetting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Checked inside the visitor, so the parser reports the error at
        // the value's line and column.
        struct UrlVisitor;

        impl serde::de::Visitor<'_> for UrlVisitor {
            type Value = StoreSetting;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a store URL, redis://HOST:PORT[/DB] or rediss://HOST:PORT[/DB]")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<StoreSetting, E> {
                StoreUrl::parse(text).map_err(E::custom)?;
                Ok(StoreSetting(text.to_owned()))
            }
        }

        deserializer.deserialize_str(UrlVisitor)
    }
}
