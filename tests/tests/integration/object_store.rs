//! Every `ObjectStore` implementation against one conformance suite, and
//! presigned URLs (what a miner without credentials gets) against a real
//! S3-compatible server (`s3s-fs` on 127.0.0.1).

use std::time::Duration;

use iota_control::s3_store::{PART_SIZE, S3Location, S3Secret, S3Store};
use iota_dataplane::fileio::FileIo;
use iota_dataplane::local_store::LocalDirStore;
use iota_protocol::object_store::ObjectStore;
use iota_tests::s3::{S3Server, conformance, send_presigned};

/// Large enough that the S3 store uploads it in two parts.
const LARGE: usize = PART_SIZE + (1 << 20) + 7;

#[tokio::test]
async fn the_local_directory_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
    conformance(store.as_ref(), LARGE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_store_passes_the_conformance_suite() {
    let Some(server) = S3Server::start() else { return };
    conformance(&server.store("iota-conformance", "run-1").await, LARGE).await;
    // Two stores in one bucket under different prefixes do not see each other.
    let other = server.store("iota-conformance", "run-2").await;
    assert!(other.list("e1/stage-000/").await.unwrap().is_empty());
    assert_eq!(other.get("e1/stage-000/a.st").await.unwrap_err().kind(), std::io::ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_a_clear_error() {
    let Some(server) = S3Server::start() else { return };
    server.store("iota-creds", "").await;
    let loc = S3Location::parse("s3://iota-creds", Some(server.endpoint.clone()), "us-east-1".into(), true).unwrap();
    let forged = S3Store::new(loc, S3Secret { access_key: "iota-test-access".into(), secret_key: "guessed".into() });
    let e = forged.put("k", vec![1]).await.unwrap_err();
    assert!(e.to_string().contains("S3 put k"), "{e}");
    assert!(!e.to_string().contains("guessed"), "the secret must not reach an error message: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presigned_url_grants_one_key_one_method_for_a_while() {
    let Some(server) = S3Server::start() else { return };
    let store = server.store("iota-presign", "run").await;
    let body = b"a miner's upload".to_vec();

    let put =
        store.presign_put("epoch-000001/stage-000/up.st", body.len() as u64, Duration::from_secs(60)).await.unwrap();
    assert!(put.url.contains("X-Amz-Signature="), "{}", put.url);
    assert!(!put.url.contains(iota_tests::s3::SECRET_KEY));
    // The length is signed: a grant for n bytes does not write n + 9.
    let longer = [body.as_slice(), b" and more"].concat();
    assert_eq!(send_presigned(&put, &longer).await.unwrap().status, 403);
    let r = send_presigned(&put, &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(store.get("epoch-000001/stage-000/up.st").await.unwrap(), body);

    let get = store.presign_get("epoch-000001/stage-000/up.st", Duration::from_secs(60)).await.unwrap();
    let r = send_presigned(&get, &[]).await.unwrap();
    assert_eq!((r.status, r.body), (200, body.clone()));

    // The same signature on another key, another method, or with the
    // signature stripped: refused, and nothing is written.
    let mut elsewhere = put.clone();
    elsewhere.url = put.url.replace("up.st", "merged.st");
    assert_eq!(send_presigned(&elsewhere, &body).await.unwrap().status, 403);
    let mut as_get = put.clone();
    as_get.method = "GET".into();
    assert_eq!(send_presigned(&as_get, &[]).await.unwrap().status, 403);
    let mut unsigned = put.clone();
    unsigned.url = put.url.split('?').next().unwrap().to_string();
    assert_eq!(send_presigned(&unsigned, &body).await.unwrap().status, 403);
    assert_eq!(store.get("epoch-000001/stage-000/merged.st").await.unwrap_err().kind(), std::io::ErrorKind::NotFound);

    // A grant expires.
    let brief = store.presign_get("epoch-000001/stage-000/up.st", Duration::from_secs(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(send_presigned(&brief, &[]).await.unwrap().status, 403, "an expired URL still worked");
}
