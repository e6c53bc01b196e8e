//! Login-mode service URLs on a simulated host, end to end over HTTP: the
//! unmodified SDK asks for one, a browser (a cookie jar) signs in and
//! reaches the service, and the SDK's own `SandboxTokenVerifier` accepts
//! the user token the service got, and refuses a tampered one or one
//! presented to another service (`tests/sdk/login_urls.py` says what each
//! step shows).

use crate::harness::Server;
use crate::sdk_surface::python;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_urls_admit_signed_in_members_and_the_sdk_verifies_their_tokens() {
    let (server, _sim) = Server::on_sim_signed().await;
    let sandbox = server.sandbox("login-box").await;
    let name = sandbox["name"].as_str().unwrap().to_owned();
    let python = python::sdk_python();
    let endpoint = format!("http://{}", server.addr);
    let (admin, other) = (server.admin.clone(), server.other.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/sdk/login_urls.py"
            ))
            .env("LANGSMITH_ENDPOINT", endpoint)
            .env("LANGSMITH_API_KEY", admin)
            .env("OTHER_API_KEY", other)
            .env("SANDBOX", name)
            .env("NO_PROXY", "*")
            .output()
            .expect("run tests/sdk/login_urls.py")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("PASS"),
        "login_urls.py: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
