//! Compiles `proto/` into the gRPC client and server of the example and its tests, only when
//! the `grpc` feature is on: without it, the build script does nothing.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_GRPC");
    println!("cargo:rerun-if-env-changed=PROTOC");
    #[cfg(feature = "grpc")]
    if std::env::var_os("CARGO_FEATURE_GRPC").is_some() {
        // The vendored protoc unless PROTOC names another.
        if std::env::var_os("PROTOC").is_none() {
            match protoc_bin_vendored::protoc_bin_path() {
                Ok(protoc) => std::env::set_var("PROTOC", protoc),
                Err(err) => panic!(
                    "no vendored protoc for this platform ({err}); install `protoc` \
                     (Debian/Ubuntu: apt-get install protobuf-compiler) and set PROTOC to its path"
                ),
            }
        }
        if let Err(err) = tonic_prost_build::compile_protos("proto/tools.proto") {
            panic!("compiling proto/tools.proto failed: {err}");
        }
    }
}
