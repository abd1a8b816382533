// include_bytes! makes cargo rebuild when an embedded file changes, but not when one is added:
// watch the folder the example embeds (an application does the same for its own folder).
fn main() {
    println!("cargo:rerun-if-changed=examples/migrations");
}
