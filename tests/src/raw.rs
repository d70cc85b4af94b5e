//! Byte-level clients for the cases curl cannot produce: exact SOCKS5
//! reply codes and malformed requests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A blocking TCP connection with a generous read timeout.
pub fn connect(address: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(address).expect("connecting to the proxy");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    stream
}

/// Like [`connect`], from the local address `source` (any 127.0.0.0/8
/// address is a different customer address on loopback).
pub fn connect_from(source: std::net::IpAddr, address: SocketAddr) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime to connect with");
    let stream = runtime
        .block_on(async {
            let socket = match source {
                std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            socket.bind(SocketAddr::new(source, 0))?;
            socket.connect(address).await?.into_std()
        })
        .unwrap_or_else(|error| panic!("connecting to {address} from {source}: {error}"));
    stream.set_nonblocking(false).expect("blocking mode");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    stream
}

/// Reads exactly `n` bytes.
pub fn read_exact(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buffer = vec![0u8; n];
    stream
        .read_exact(&mut buffer)
        .expect("reading the proxy's reply");
    buffer
}

/// True when the peer closed the connection (EOF or reset) within the
/// read timeout; false if it sent more bytes or stayed silent.
pub fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Greets with username/password, authenticates, and returns the auth status byte.
pub fn socks5_login(stream: &mut TcpStream, user: &str, password: &str) -> u8 {
    let status = try_socks5_login(stream, user, password);
    status.expect("the server refused username/password (0xFF) or closed before choosing a method")
}

/// Like [`socks5_login`], but `None` instead of a panic when the server
/// refuses the method (`[5, 0xFF]`, as a plane at its connection cap does)
/// or closes before choosing one (as a plane at its fd limit does): for
/// polling until a refusing plane serves again.
pub fn try_socks5_login(stream: &mut TcpStream, user: &str, password: &str) -> Option<u8> {
    stream.write_all(&[5, 1, 2]).ok()?;
    let mut method = [0u8; 2];
    stream.read_exact(&mut method).ok()?;
    if method == [5, 0xFF] {
        return None;
    }
    assert_eq!(method, [5, 2], "server chose username/password");
    let mut auth = vec![1, user.len() as u8];
    auth.extend_from_slice(user.as_bytes());
    auth.push(password.len() as u8);
    auth.extend_from_slice(password.as_bytes());
    stream.write_all(&auth).expect("credentials");
    Some(read_exact(stream, 2)[1])
}

/// Sends a CONNECT to an IPv4 address and returns the reply code.
pub fn socks5_connect_v4(stream: &mut TcpStream, target: SocketAddr) -> u8 {
    let SocketAddr::V4(v4) = target else {
        panic!("IPv4 target expected")
    };
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&v4.ip().octets());
    request.extend_from_slice(&v4.port().to_be_bytes());
    stream.write_all(&request).expect("request");
    let reply = read_exact(stream, 10);
    assert_eq!(reply[0], 5, "SOCKS5 reply version");
    reply[1]
}

/// Sends a CONNECT to a domain name (ATYP 3) and returns the reply code
/// (reading the reply's bound address, whatever its type).
pub fn socks5_connect_name(stream: &mut TcpStream, host: &str, port: u16) -> u8 {
    let length = u8::try_from(host.len()).expect("a name of 255 bytes at most");
    let mut request = vec![5, 1, 0, 3, length];
    request.extend_from_slice(host.as_bytes());
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).expect("request");
    let head = read_exact(stream, 4);
    assert_eq!(head[0], 5, "SOCKS5 reply version");
    let rest = match head[3] {
        4 => 18,
        3 => usize::from(read_exact(stream, 1)[0]) + 2,
        _ => 6,
    };
    read_exact(stream, rest);
    head[1]
}
