use super::*;

fn names() -> Vec<String> {
    vec![
        "kvcache-operator-webhook.gpustack-system.svc".into(),
        "127.0.0.1".into(),
    ]
}

#[test]
fn nothing_stored_makes_a_ca_and_a_serving_pair_that_then_is_kept() {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let empty = Stored::default();
    let p = plan(&empty, &names(), now);
    assert_eq!(p, Plan::NewCa("no CA is stored"));
    let made = carry_out(&p, &empty, &names()).expect("made");
    assert_eq!(plan(&made, &names(), now), Plan::Keep);
    let f = facts(&made.tls_cert).expect("a certificate");
    assert_eq!(f.names, names());
    assert!(made.ca_previous.is_empty());
    // The presented pair loads.
    let presented = Presented::default();
    presented.load(&made).expect("loads");
    assert!(presented.loaded());
    assert_eq!(presented.not_after(), f.not_after);
}

#[test]
fn expiry_and_a_new_name_renew_the_serving_pair_and_an_old_ca_stays_trusted() {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let made = carry_out(&Plan::NewCa("test"), &Stored::default(), &names()).expect("made");
    let day = 24 * 3600;
    assert_eq!(
        plan(&made, &names(), now + 61 * day),
        Plan::RenewServing("the serving certificate expires within 30 days")
    );
    let mut more = names();
    more.push("kvcache-operator-webhook.gpustack-system.svc.cluster.local".into());
    assert!(matches!(plan(&made, &more, now), Plan::RenewServing(_)));
    let renewed = carry_out(&plan(&made, &more, now), &made, &more).expect("renewed");
    assert_eq!(renewed.ca_cert, made.ca_cert, "the CA is kept");
    assert_ne!(renewed.tls_cert, made.tls_cert);
    // Near the CA's end: a new CA, the old one still in the bundle.
    let late = now + 5 * 365 * day - 100 * day;
    assert_eq!(
        plan(&renewed, &more, late),
        Plan::NewCa("the CA expires soon")
    );
    let rotated = carry_out(&plan(&renewed, &more, late), &renewed, &more).expect("rotated");
    assert_ne!(rotated.ca_cert, renewed.ca_cert);
    assert!(rotated.ca_bundle().contains(renewed.ca_cert.trim()));
    assert!(rotated.ca_bundle().contains(rotated.ca_cert.trim()));
}

#[test]
fn the_ca_key_is_kept_apart_and_a_secret_of_the_old_layout_is_split() {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let made = carry_out(&Plan::NewCa("test"), &Stored::default(), &names()).expect("made");
    assert!(!made.serving_data().contains_key(CA_KEY));
    assert_eq!(
        made.serving_data().get(CA_CERT),
        Some(&made.ca_cert.as_bytes().to_vec()),
        "the serving Secret carries the CA certificate"
    );
    assert!(made.ca_data().contains_key(CA_KEY));
    // Read back from the two Secrets: the same pair, kept, nothing to write.
    let (serving, ca) = (made.serving_data(), made.ca_data());
    let read = Stored::from_secrets(&serving, &ca);
    assert_eq!(read, made);
    assert_eq!(plan(&read, &names(), now), Plan::Keep);
    assert_eq!(writes(&Plan::Keep, &read, &serving, &ca), Writes::default());
    // Before the split: one Secret with every key and no CA Secret. The same pair is read
    // and kept, and both Secrets are written, the serving one without the key.
    let mut old = serving.clone();
    old.extend(ca.clone());
    let read = Stored::from_secrets(&old, &Data::new());
    assert_eq!(read, made);
    assert_eq!(
        writes(&Plan::Keep, &read, &old, &Data::new()),
        Writes {
            ca: true,
            serving: true
        }
    );
    // A standby reads the serving Secret alone: it has the pair and the CA certificate to
    // check the configurations' trust, not the key.
    let standby = Stored::from_secrets(&serving, &Data::new());
    assert_eq!(standby.tls_cert, made.tls_cert);
    assert_eq!(standby.ca_cert, made.ca_cert);
    assert!(standby.ca_key.is_empty());
    // A renewal writes the serving Secret alone; a new CA both.
    let renewed = carry_out(&Plan::RenewServing("test"), &read, &names()).expect("renewed");
    assert_eq!(
        writes(&Plan::RenewServing("test"), &renewed, &serving, &ca),
        Writes {
            ca: false,
            serving: true
        }
    );
    let rotated = carry_out(&Plan::NewCa("test"), &read, &names()).expect("rotated");
    assert_eq!(
        writes(&Plan::NewCa("test"), &rotated, &serving, &ca),
        Writes {
            ca: true,
            serving: true
        }
    );
}

#[test]
fn garbage_in_the_secret_is_replaced_not_a_panic() {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let junk = Stored {
        ca_cert: "not a certificate".into(),
        ca_key: "nor a key".into(),
        tls_cert: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
        tls_key: String::new(),
        ca_previous: String::new(),
    };
    assert_eq!(plan(&junk, &names(), now), Plan::NewCa("no CA is stored"));
    assert!(carry_out(&plan(&junk, &names(), now), &junk, &names()).is_ok());
}
