//! Certificates for a local control plane: a CA, a serving certificate for 127.0.0.1/localhost,
//! an admin client certificate in `system:masters`, and a service-account signing key.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::Result;

/// PEM files written for the control plane.
#[derive(Clone, Debug)]
pub struct PkiFiles {
    /// The CA certificate, which the API server, the kubeconfigs and the nodes trust.
    pub ca_cert: PathBuf,
    /// The CA key (the controller manager signs nothing with it here, but keeps it at hand).
    pub ca_key: PathBuf,
    /// The API server's serving certificate.
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// The admin client certificate (`system:masters`).
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    /// Service-account signing key (private).
    pub sa_key: PathBuf,
    /// Service-account verification key (public).
    pub sa_pub: PathBuf,
}

fn name(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

/// A CA that can issue more certificates (the operator's webhook serving certificate, say).
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// A fresh self-signed CA.
    pub fn new(cn: &str) -> Result<Ca> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(cn, None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)?,
        })
    }

    /// The CA certificate as PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA key as PEM.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A serving certificate for `hosts` (DNS names and IP addresses): (cert PEM, key PEM).
    pub fn server(&self, hosts: &[&str]) -> Result<(String, String)> {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let mut params = CertificateParams::new(hosts)?;
        params.distinguished_name = name("kvcache-serving", None);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A client certificate for user `cn` in group `org`: (cert PEM, key PEM).
    pub fn client(&self, cn: &str, org: &str) -> Result<(String, String)> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(cn, Some(org));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

fn write(dir: &Path, file: &str, pem: &str) -> Result<PathBuf> {
    let path = dir.join(file);
    std::fs::write(&path, pem).map_err(crate::io(format!("writing {}", path.display())))?;
    Ok(path)
}

/// Generates and writes every certificate the control plane needs into `dir`; returns the CA
/// too, so more users can be issued later.
pub fn control_plane(dir: &Path, advertise: Option<&str>) -> Result<(Ca, PkiFiles)> {
    let ca = Ca::new("kvcache-e2e-ca")?;
    // The `kubernetes` Service's ClusterIP and the advertised address, for Pods and nodes.
    let mut names = vec![
        "localhost",
        "127.0.0.1",
        "10.96.0.1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    names.extend(advertise);
    let (serving_cert, serving_key) = ca.server(&names)?;
    let (admin_cert, admin_key) = ca.client("kvcache-admin", "system:masters")?;
    let sa = KeyPair::generate()?;
    let files = PkiFiles {
        ca_cert: write(dir, "ca.crt", &ca.cert_pem())?,
        ca_key: write(dir, "ca.key", &ca.key_pem())?,
        serving_cert: write(dir, "apiserver.crt", &serving_cert)?,
        serving_key: write(dir, "apiserver.key", &serving_key)?,
        admin_cert: write(dir, "admin.crt", &admin_cert)?,
        admin_key: write(dir, "admin.key", &admin_key)?,
        sa_key: write(dir, "sa.key", &sa.serialize_pem())?,
        sa_pub: write(dir, "sa.pub", &sa.public_key_pem())?,
    };
    Ok((ca, files))
}
