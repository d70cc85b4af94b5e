//! The control socket (`<runtime_dir>/control.sock`, docs/ARCHITECTURE.md)
//! spoken to as a script would, without `blipless-ctl`: one JSON request per
//! line, one JSON answer per line.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use blipless_tests::node::Node;

/// Sends `request` and closes the sending side, as `printf ... | socat`
/// does; returns the whole answer.
fn ask(node: &Node, request: &[u8]) -> String {
    let path = node.dir.path().join("run").join("control.sock");
    let mut stream = UnixStream::connect(&path).expect("control.sock");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    stream.write_all(request).expect("request");
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    answer
}

#[test]
fn a_last_request_line_without_its_newline_is_answered() {
    let mut node = Node::new("");
    let (_ingress, _device, _client) = node.start();
    let answer = ask(&node, br#"{"command":"status"}"#);
    assert!(answer.contains(r#""result":"status""#), "{answer}");
    // With its newline, as ever; and a line over the cap is refused as such.
    let answer = ask(&node, b"{\"command\":\"status\"}\n");
    assert!(answer.contains(r#""result":"status""#), "{answer}");
    let long = format!(
        "{{\"command\":\"status\",\"pad\":\"{}\"}}",
        "x".repeat(8192)
    );
    let answer = ask(&node, long.as_bytes());
    assert!(answer.contains("request line over"), "{answer}");
}
