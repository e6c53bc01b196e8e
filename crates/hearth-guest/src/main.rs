fn main() { println!("{:?}", std::env::args().collect::<Vec<_>>()); let t = std::thread::spawn(|| 1); println!("{}", t.join().unwrap()); }
