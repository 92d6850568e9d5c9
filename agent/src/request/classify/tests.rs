//! Tests of the classification, by part: attributes, bucket keys, cell keys, the classifier.

mod attributes {
    use crate::request::classify::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn valid_bytes_are_the_value_without_a_copy() {
        let borrowed = Attribute::from_host(Some(Cow::Borrowed(b"acme".as_slice())));
        assert!(matches!(borrowed, Attribute::Text(Cow::Borrowed("acme"))));
        let owned = Attribute::from_host(Some(Cow::Owned("é".as_bytes().to_vec())));
        assert!(matches!(&owned, Attribute::Text(Cow::Owned(text)) if text == "é"));
        assert_eq!(
            Attribute::from_host(Some(Cow::Borrowed(b"".as_slice()))),
            Attribute::Text(Cow::Borrowed(""))
        );
        assert_eq!(Attribute::from_host(None), Attribute::Absent);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_invalid() {
        // A lone byte above 0x7f, a cut two-byte sequence, an overlong
        // encoding of '/', a surrogate, and a valid prefix before a bad byte.
        let samples: [&[u8]; 5] = [
            b"\xff",
            b"ab\xc3",
            b"\xc0\xaf",
            b"\xed\xa0\x80",
            b"acme\x80",
        ];
        for bytes in samples {
            assert_eq!(
                Attribute::from_host(Some(Cow::Borrowed(bytes))),
                Attribute::Invalid,
                "{bytes:?}"
            );
            assert_eq!(
                Attribute::from_host(Some(Cow::Owned(bytes.to_vec()))),
                Attribute::Invalid,
                "{bytes:?}"
            );
        }
    }

    struct Bytes;

    impl RequestAttributes for Bytes {
        fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
            match name {
                "good" => Some(Cow::Borrowed(b"value".as_slice())),
                "bad" => Some(Cow::Borrowed(b"\xfe\xff".as_slice())),
                _ => None,
            }
        }

        fn route_name(&self) -> Option<Cow<'_, [u8]>> {
            Some(Cow::Owned(vec![b'r', 0xff]))
        }
    }

    #[test]
    fn the_reader_counts_only_invalid_values() {
        let mut reader = AttributeReader::new(&Bytes);
        assert_eq!(reader.header("good").as_deref(), Some("value"));
        assert_eq!(reader.header("absent"), None);
        assert_eq!(reader.invalid(), 0);
        assert_eq!(reader.header("bad"), None);
        assert_eq!(reader.route_name(), None);
        assert_eq!(reader.invalid(), 2);
    }
}

mod bucket_key {
    use crate::request::classify::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use crate::testing::request::FakeRequest as Request;

    fn part(source: KeySource) -> KeyPart {
        KeyPart {
            source,
            default: "-".into(),
        }
    }

    fn request(headers: &[(&'static str, &'static str)]) -> Request {
        Request::with_headers(headers)
    }

    #[test]
    fn joins_all_sources_with_the_separator() {
        let spec = BucketKeySpec::new(
            vec![
                part(KeySource::Header("x-tenant".into())),
                part(KeySource::Authority),
                part(KeySource::PathPrefix(1)),
                part(KeySource::RouteName),
                part(KeySource::Literal("api".into())),
            ],
            "/".into(),
        );
        let mut req = request(&[
            ("x-tenant", "acme"),
            (":authority", "Shop.Example"),
            (":path", "/v1/items?q=1"),
        ]);
        req.route = Some("catalog");
        assert_eq!(spec.derive(&req), "acme/shop.example//v1/catalog/api");
    }

    #[test]
    fn absent_or_empty_attributes_use_the_default() {
        let spec = BucketKeySpec::new(
            vec![
                KeyPart {
                    source: KeySource::Header("x-tenant".into()),
                    default: "anonymous".into(),
                },
                part(KeySource::RouteName),
            ],
            ":".into(),
        );
        assert_eq!(spec.derive(&request(&[])), "anonymous:-");
        assert_eq!(spec.derive(&request(&[("x-tenant", "")])), "anonymous:-");
    }

    #[test]
    fn values_that_are_not_utf8_use_the_default_and_are_counted() {
        let spec = BucketKeySpec::new(
            vec![
                part(KeySource::Header("x-tenant".into())),
                part(KeySource::Authority),
                part(KeySource::PathPrefix(1)),
                part(KeySource::RouteName),
            ],
            "/".into(),
        );
        let mut req = request(&[]);
        req.raw_headers.insert("x-tenant", b"ac\xffme");
        req.raw_headers.insert(":authority", b"Shop\xc3");
        req.raw_headers.insert(":path", b"/v1\x80/items");
        req.raw_route = Some(b"\xfe");
        let mut reader = AttributeReader::new(&req);
        let mut key = String::new();
        spec.derive_into(&mut reader, &mut key);
        assert_eq!(key, "-/-/-/-");
        assert_eq!(reader.invalid(), 4);
    }

    #[test]
    fn only_the_authority_is_lower_cased() {
        let spec = BucketKeySpec::new(
            vec![
                part(KeySource::Header("x-tenant".into())),
                part(KeySource::Authority),
            ],
            "/".into(),
        );
        let req = request(&[("x-tenant", "ACME"), (":authority", "Shop.Example")]);
        assert_eq!(spec.derive(&req), "ACME/shop.example");
    }

    fn path_prefix(path: &str, segments: usize) -> String {
        let mut prefix = String::from("kept:");
        write_path_prefix(path, segments, &mut prefix);
        prefix.split_off("kept:".len())
    }

    #[test]
    fn path_prefix_takes_non_empty_segments_without_query() {
        assert_eq!(path_prefix("/a/b/c?x=/y", 2), "/a/b");
        assert_eq!(path_prefix("//a//b", 1), "/a");
        assert_eq!(path_prefix("/a#frag", 3), "/a");
        assert_eq!(path_prefix("/", 1), "/");
        assert_eq!(path_prefix("/?q", 1), "/");
    }

    #[test]
    fn long_keys_are_cut_at_a_char_boundary() {
        let spec = BucketKeySpec::new(vec![part(KeySource::Header("x".into()))], "/".into());
        let long: &'static str = Box::leak("é".repeat(MAX_BUCKET_KEY_BYTES).into_boxed_str());
        let key = spec.derive(&request(&[("x", long)]));
        assert!(key.len() <= MAX_BUCKET_KEY_BYTES);
        assert!(key.len() >= MAX_BUCKET_KEY_BYTES - 1);
        assert!(key.chars().all(|c| c == 'é'));
    }

    #[test]
    fn route_name_use_is_reported() {
        let with = BucketKeySpec::new(vec![part(KeySource::RouteName)], "/".into());
        let without = BucketKeySpec::new(vec![part(KeySource::Authority)], "/".into());
        assert!(with.uses_route_name());
        assert!(!without.uses_route_name());
    }
}

mod cell {
    use crate::request::classify::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn keys_round_trip() {
        for (bucket, tenant, priority) in [
            ("acme", "", Priority::Unspecified),
            ("a/b", "t1", Priority::Critical),
            ("", "x", Priority::Bulk),
            ("0031abc", "003", Priority::Degraded),
        ] {
            let key = key_of(bucket, tenant, priority);
            assert_eq!(parse_key(&key), Some((bucket, tenant, priority)));
        }
    }

    #[test]
    fn distinct_cells_have_distinct_keys() {
        // Without the length prefix these two would collide.
        assert_ne!(
            key_of("bc", "a", Priority::Bulk),
            key_of("c", "ab", Priority::Bulk)
        );
        assert_ne!(
            key_of("a", "", Priority::Bulk),
            key_of("a", "", Priority::Critical)
        );
    }

    #[test]
    fn bucket_wide_keys_are_the_prefix_and_the_bucket() {
        assert_eq!(BUCKET_WIDE_PREFIX.as_bytes(), BUCKET_WIDE_PREFIX_BYTES);
        let key = key_of("acme", "", Priority::Unspecified);
        assert_eq!(key.strip_prefix(BUCKET_WIDE_PREFIX), Some("acme"));
    }

    #[test]
    fn malformed_keys_do_not_parse() {
        for bad in ["", "9000a", "0x00a", "0009ab", "0"] {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn long_tenants_are_cut() {
        let tenant = "é".repeat(MAX_TENANT_BYTES);
        let key = key_of("b", &tenant, Priority::Unspecified);
        let (bucket, parsed, _) = parse_key(&key).unwrap();
        assert_eq!(bucket, "b");
        assert!(parsed.len() <= MAX_TENANT_BYTES);
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod cell_proptests {
    use crate::request::classify::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_cell_round_trips(bucket in ".{0,40}", tenant in ".{0,40}", p in 0i32..5) {
            let priority = Priority::from_wire(p);
            let key = key_of(&bucket, &tenant, priority);
            prop_assert_eq!(parse_key(&key), Some((bucket.as_str(), tenant.as_str(), priority)));
        }
    }
}

mod classify {
    use crate::request::classify::KeySource;
    use crate::request::classify::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use crate::testing::request::FakeRequest as Request;

    fn classifier() -> Classifier {
        Classifier {
            bucket_key: BucketKeySpec::new(
                vec![KeyPart {
                    source: KeySource::Authority,
                    default: "-".into(),
                }],
                "/".into(),
            ),
            tenant: Some(KeyPart {
                source: KeySource::Header("x-tenant".into()),
                default: "default".into(),
            }),
            priority: Some(PrioritySpec {
                header: Some("x-priority".into()),
                values: vec![
                    ("critical".into(), Priority::Critical),
                    ("batch".into(), Priority::Bulk),
                ],
                routes: vec![("checkout".into(), Priority::Critical)],
                default: Priority::BestEffort,
            }),
        }
    }

    fn classify(request: &Request) -> (String, String, Priority) {
        let mut buf = CellKeyBuf::default();
        let invalid = classifier().classify_into(request, &mut buf);
        assert_eq!(invalid, 0);
        (buf.bucket.clone(), buf.tenant.clone(), buf.priority)
    }

    #[test]
    fn header_then_route_then_default() {
        let mut request = Request::default();
        request.headers.insert(":authority", "api");
        request.headers.insert("x-tenant", "acme");
        request.headers.insert("x-priority", "BATCH");
        request.route = Some("checkout");
        assert_eq!(
            classify(&request),
            ("api".into(), "acme".into(), Priority::Bulk)
        );
        request.headers.insert("x-priority", "unknown");
        assert_eq!(classify(&request).2, Priority::Critical);
        request.route = Some("browse");
        assert_eq!(classify(&request).2, Priority::BestEffort);
    }

    #[test]
    fn values_that_are_not_utf8_are_absent_and_counted() {
        let mut request = Request::default();
        request.raw_headers.insert(":authority", b"api\xff");
        request.raw_headers.insert("x-tenant", b"\xff");
        request.raw_headers.insert("x-priority", b"batch\xc3");
        request.route = Some("checkout");
        let mut buf = CellKeyBuf::default();
        let invalid = classifier().classify_into(&request, &mut buf);
        assert_eq!(invalid, 3);
        // Every part falls back as if the header were not there: the
        // bucket and tenant defaults, the route's class.
        assert_eq!(
            (buf.bucket.as_str(), buf.tenant.as_str(), buf.priority),
            ("-", "default", Priority::Critical)
        );
        request.raw_route = Some(b"check\xffout");
        assert_eq!(classifier().classify_into(&request, &mut buf), 4);
        assert_eq!(buf.priority, Priority::BestEffort);
    }

    #[test]
    fn absent_tenant_takes_the_default_and_no_spec_means_none() {
        let request = Request::default();
        assert_eq!(classify(&request).1, "default");
        let bare = Classifier {
            tenant: None,
            priority: None,
            ..classifier()
        };
        let mut buf = CellKeyBuf::default();
        assert_eq!(bare.classify_into(&request, &mut buf), 0);
        assert_eq!(buf.tenant, "");
        assert_eq!(buf.priority, Priority::Unspecified);
        assert!(buf.is_bucket_wide());
        assert!(!bare.uses_route_name());
        assert!(classifier().uses_route_name());
    }
}
