//! Every byte the host reads from a guest goes through the frame decoder and
//! then through the JSON and output-chunk parsers: none of them may panic.
#![no_main]

use hearth_guest_proto::{decode_output, frame::decode_all, ExecEvent, Reply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (frames, _err) = decode_all(data);
    for f in frames {
        assert!(f.payload.len() <= hearth_guest_proto::MAX_PAYLOAD);
        let _ = serde_json::from_slice::<ExecEvent>(&f.payload);
        let _ = serde_json::from_slice::<Reply>(&f.payload);
        let _ = decode_output(&f.payload);
        let _ = f.window_credit();
        let _ = f.open_large_len();
    }
});
