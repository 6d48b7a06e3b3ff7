//! Compiles `proto/` into the gRPC client and server of the example and its tests, only when
//! the `grpc` feature is on: without it, the build script does nothing.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_GRPC");
    #[cfg(feature = "grpc")]
    if std::env::var_os("CARGO_FEATURE_GRPC").is_some() {
        if let Err(err) = tonic_prost_build::compile_protos("proto/tools.proto") {
            panic!(
                "compiling proto/tools.proto failed: {err}; \
                 install `protoc` (Debian/Ubuntu: apt-get install protobuf-compiler) \
                 or set PROTOC to its path"
            );
        }
    }
}
