//! `meridian cert`: a test CA and a certificate per node of a cluster file, for mutual TLS
//! between its nodes. Each node's certificate names it (`node-N.meridian`), so a node cannot
//! speak as another; keys are written readable by their owner only. Production clusters use
//! their own CA; this one exists so that a cluster on one machine can run authenticated.

use crate::Failure;
use clap::Args;
use meridian_core::{ConfigError, NodeId};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// Longest validity accepted (ten years).
const DAYS_MAX: u32 = 3_650;
/// Most nodes one call certifies (a cluster file's nodes).
const NODES_MAX: usize = 4_096;

/// `meridian cert`'s flags.
#[derive(Args)]
pub struct CertArgs {
    /// The cluster file whose nodes get certificates (its TLS settings may be missing).
    #[arg(long)]
    config: PathBuf,
    /// Where the files go (default: `certs` beside the cluster file); must not hold a CA yet.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Days the certificates stay valid (0: they expire at once, to test that expired
    /// certificates are refused).
    #[arg(long, default_value_t = 365)]
    days: u32,
}

/// Runs `meridian cert`.
pub fn cert(args: &CertArgs) -> Result<(), Failure> {
    if args.days > DAYS_MAX {
        return Err(ConfigError::new(format!("--days {}: at most {DAYS_MAX}", args.days)).into());
    }
    let nodes = node_ids(&args.config)?;
    let base = args.config.parent().unwrap_or(Path::new("."));
    let out = args.out.clone().unwrap_or_else(|| base.join("certs"));
    if out.join("ca.pem").exists() {
        return Err(ConfigError::new(format!(
            "{} already holds a CA (ca.pem): remove it or give another --out",
            out.display()
        ))
        .into());
    }
    std::fs::create_dir_all(&out)
        .map_err(|e| ConfigError::new(format!("{}: {e}", out.display())))?;
    let files = make(&nodes, args.days)
        .map_err(|e| Failure::Run(format!("cannot make certificates: {e}")))?;
    for (name, text, secret) in &files {
        write(&out.join(name), text, *secret)?;
    }
    say!("wrote a CA and {} node certificates to {}", nodes.len(), out.display());
    say!("add to {}:", args.config.display());
    let relative = out.strip_prefix(base).unwrap_or(&out).display().to_string();
    say!("  tls_ca = \"{relative}/ca.pem\"");
    say!("and to each [[node]] N:");
    say!("  tls_cert = \"{relative}/node-N.pem\"");
    say!("  tls_key = \"{relative}/node-N.key\"");
    Ok(())
}

/// Makes a CA and certificates for `nodes` valid for `days`, and writes them into `out`
/// (created if missing; existing files are not overwritten).
pub fn write_all(out: &Path, nodes: &[NodeId], days: u32) -> Result<(), Failure> {
    std::fs::create_dir_all(out)
        .map_err(|e| ConfigError::new(format!("{}: {e}", out.display())))?;
    let files =
        make(nodes, days).map_err(|e| Failure::Run(format!("cannot make certificates: {e}")))?;
    for (name, text, secret) in &files {
        write(&out.join(name), text, *secret)?;
    }
    Ok(())
}

/// The node ids of a cluster file, read loosely (the file may not name certificates yet).
fn node_ids(path: &Path) -> Result<Vec<NodeId>, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| ConfigError::new(format!("{}: {}", path.display(), e.to_string().trim())))?;
    let nodes = table.get("node").and_then(|n| n.as_array()).map_or(&[][..], Vec::as_slice);
    if nodes.is_empty() || nodes.len() > NODES_MAX {
        return Err(ConfigError::new(format!(
            "{}: between 1 and {NODES_MAX} [[node]] entries needed",
            path.display()
        )));
    }
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| match node.get("id").and_then(|id| id.as_integer()) {
            Some(id) if id == i as i64 => Ok(NodeId(i as u32)),
            _ => Err(ConfigError::new(format!(
                "{}: node {i}'s id must be {i} (ids in order from 0)",
                path.display()
            ))),
        })
        .collect()
}

/// The files: `(name, PEM text, secret)`.
fn make(nodes: &[NodeId], days: u32) -> Result<Vec<(String, String, bool)>, rcgen::Error> {
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::hours(1);
    let not_after = now + time::Duration::days(i64::from(days));
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(DnType::CommonName, "Meridian test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (ca_params.not_before, ca_params.not_after) = (not_before, not_after);
    let ca = ca_params.self_signed(&ca_key)?;
    let mut files = vec![
        ("ca.pem".to_string(), ca.pem(), false),
        ("ca.key".to_string(), ca_key.serialize_pem(), true),
    ];
    for node in nodes {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![meridian_runtime::tls::node_name(*node)])?;
        params.distinguished_name.push(DnType::CommonName, format!("meridian node {}", node.0));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        (params.not_before, params.not_after) = (not_before, not_after);
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        files.push((format!("node-{}.pem", node.0), cert.pem(), false));
        files.push((format!("node-{}.key", node.0), key.serialize_pem(), true));
    }
    Ok(files)
}

/// Writes `text` to `path`; a secret is readable by its owner only.
fn write(path: &Path, text: &str, secret: bool) -> Result<(), ConfigError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if secret { 0o600 } else { 0o644 };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
    file.write_all(text.as_bytes())
        .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))
}
