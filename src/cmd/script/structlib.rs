//! `struct` for scripts, as Redis bundles it (Roberto Ierusalimschy's struct library):
//! `struct.pack`, `struct.unpack` and `struct.size`, with the same bytes, results and errors.
//!
//! A format is read one option at a time: `>` and `<` set big and little endian (little is
//! the default, x86's), `!n` the largest alignment (8 when `n` is left out), a space is
//! skipped; `b`/`B` (1 byte), `h`/`H` (2), `l`/`L` (8), `T` (8), `in`/`In` (`n` bytes, 4 by
//! default, at most 32) are signed and unsigned integers; `f` and `d` a float and a double;
//! `x` one zero byte; `cn` a string of `n` bytes (1 by default; `c0` is the whole string when
//! packing, and the number read just before when unpacking); `s` a string ended by a zero
//! byte. Integers and floats are aligned to the smaller of their size and the alignment.
//!
//! Integers are read and written through 64 bits, as the C library (with `long`) does: an
//! integer wider than 8 bytes packs its high bytes as zeros and unpacks its low 8 only.

use super::lib_args::{arg_error, check_bytes, check_number, opt_integer};
use super::lua_api::Raised;
use mlua::{Lua, Table, Value, Variadic};

/// The widest integer option.
const MAX_INT_SIZE: usize = 32;
/// `!` without a number: the alignment of a double on x86-64.
const MAX_ALIGN: usize = 8;
/// Results `struct.unpack` returns at most (Lua's stack bound).
const MAX_RESULTS: usize = 7_990;

/// Why a format or its data was refused.
enum StructError {
    /// `luaL_error`: a message alone.
    Plain(String),
    /// `luaL_argerror`: a message about one argument.
    Arg(usize, String),
}

impl StructError {
    fn raise(self, lua: &Lua, function: &str) -> mlua::Error {
        match self {
            StructError::Plain(why) => Raised::library(lua, &why),
            StructError::Arg(n, why) => arg_error(lua, n, function, &why),
        }
    }
}

/// The endianness and alignment a format has set so far.
struct Header {
    little: bool,
    align: usize,
}

impl Default for Header {
    fn default() -> Self {
        Header {
            little: true,
            align: 1,
        }
    }
}

/// The format being read.
struct Format<'a> {
    text: &'a [u8],
    at: usize,
}

impl Format<'_> {
    fn next(&mut self) -> Option<u8> {
        let c = *self.text.get(self.at)?;
        self.at += 1;
        Some(c)
    }

    /// The number written at this point of the format, or `default` when there is none.
    fn number(&mut self, default: usize) -> Result<usize, StructError> {
        let mut seen = false;
        let mut a: i32 = 0;
        while let Some(&d) = self.text.get(self.at).filter(|d| d.is_ascii_digit()) {
            seen = true;
            let d = i32::from(d - b'0');
            a = a
                .checked_mul(10)
                .and_then(|a| a.checked_add(d))
                .ok_or_else(|| StructError::Plain("integral size overflow".into()))?;
            self.at += 1;
        }
        Ok(if seen { a as usize } else { default })
    }

    /// The size of option `opt` (reading its number, for `c`, `i` and `I`).
    fn size(&mut self, opt: u8) -> Result<usize, StructError> {
        Ok(match opt {
            b'b' | b'B' | b'x' => 1,
            b'h' | b'H' => 2,
            b'l' | b'L' | b'T' | b'd' => 8,
            b'f' => 4,
            b'c' => self.number(1)?,
            b'i' | b'I' => {
                let n = self.number(4)?;
                if n > MAX_INT_SIZE {
                    return Err(StructError::Plain(format!(
                        "integral size {n} is larger than limit of {MAX_INT_SIZE}"
                    )));
                }
                n
            }
            _ => 0,
        })
    }

    /// Reads a control option (endianness, alignment, a space); anything else is refused.
    fn control(&mut self, opt: u8, h: &mut Header) -> Result<(), StructError> {
        match opt {
            b' ' => {}
            b'>' => h.little = false,
            b'<' => h.little = true,
            b'!' => {
                let a = self.number(MAX_ALIGN)?;
                if !a.is_power_of_two() {
                    return Err(StructError::Plain(format!(
                        "alignment {a} is not a power of 2"
                    )));
                }
                h.align = a;
            }
            other => {
                return Err(StructError::Arg(
                    1,
                    format!("invalid format option '{}'", char::from(other)),
                ));
            }
        }
        Ok(())
    }
}

/// Padding before an option of `size` at offset `len` (the C library's arithmetic, odd
/// sizes included).
fn padding(len: usize, h: &Header, opt: u8, size: usize) -> usize {
    if size == 0 || opt == b'c' {
        return 0;
    }
    let size = size.min(h.align);
    size.wrapping_sub(len & size.wrapping_sub(1)) & size.wrapping_sub(1)
}

/// The format argument: up to its first zero byte, as C reads it.
fn format_arg(lua: &Lua, args: &[Value], function: &str) -> mlua::Result<Vec<u8>> {
    let mut f = check_bytes(lua, args, 1, function)?;
    if let Some(end) = f.iter().position(|&b| b == 0) {
        f.truncate(end);
    }
    Ok(f)
}

fn pack(lua: &Lua, args: &[Value]) -> mlua::Result<Vec<u8>> {
    // The C library pushes a nil above its arguments before it reads them: one argument
    // too few is "got nil", not "got no value".
    let mut args = args.to_vec();
    args.push(Value::Nil);
    let args = &args[..];
    let fmt = format_arg(lua, args, "pack")?;
    let mut f = Format { text: &fmt, at: 0 };
    let mut h = Header::default();
    let mut out = Vec::new();
    let mut arg = 2;
    let fail = |e: StructError| e.raise(lua, "pack");
    while let Some(opt) = f.next() {
        let size = f.size(opt).map_err(fail)?;
        let pad = padding(out.len(), &h, opt, size);
        out.resize(out.len() + pad, 0);
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let n = check_number(lua, args, arg, "pack")?;
                arg += 1;
                let mut v = if n < 0.0 { n as i64 as u64 } else { n as u64 };
                let mut bytes = vec![0u8; size];
                for i in 0..size {
                    let at = if h.little { i } else { size - 1 - i };
                    bytes[at] = (v & 0xff) as u8;
                    v >>= 8;
                }
                out.extend_from_slice(&bytes);
            }
            b'x' => out.push(0),
            b'f' => {
                let n = check_number(lua, args, arg, "pack")? as f32;
                arg += 1;
                out.extend_from_slice(&if h.little {
                    n.to_le_bytes()
                } else {
                    n.to_be_bytes()
                });
            }
            b'd' => {
                let n = check_number(lua, args, arg, "pack")?;
                arg += 1;
                out.extend_from_slice(&if h.little {
                    n.to_le_bytes()
                } else {
                    n.to_be_bytes()
                });
            }
            b'c' | b's' => {
                let s = check_bytes(lua, args, arg, "pack")?;
                arg += 1;
                let take = if size == 0 { s.len() } else { size };
                if s.len() < take {
                    // The C library names the argument after the string, as it counts.
                    return Err(fail(StructError::Arg(arg, "string too short".into())));
                }
                out.extend_from_slice(&s[..take]);
                if opt == b's' {
                    out.push(0);
                }
            }
            _ => f.control(opt, &mut h).map_err(fail)?,
        }
    }
    Ok(out)
}

/// One integer of `size` bytes, as the C library reads it through 64 bits.
fn read_integer(bytes: &[u8], little: bool, signed: bool) -> f64 {
    let mut l: u64 = 0;
    let mut take = |b: u8| l = (l << 8) | u64::from(b);
    if little {
        bytes.iter().rev().for_each(|&b| take(b));
    } else {
        bytes.iter().for_each(|&b| take(b));
    }
    if !signed {
        return l as f64;
    }
    let shift = (bytes.len() as i64 * 8 - 1) as u32;
    let mask = u64::MAX.wrapping_shl(shift);
    if l & mask != 0 {
        l |= mask;
    }
    l as i64 as f64
}

fn unpack(lua: &Lua, args: &[Value]) -> mlua::Result<Vec<Value>> {
    let fmt = format_arg(lua, args, "unpack")?;
    let data = check_bytes(lua, args, 2, "unpack")?;
    let fail = |e: StructError| e.raise(lua, "unpack");
    // size_t arithmetic, as in C: a negative offset wraps to a huge one.
    let mut pos = opt_integer(lua, args, 3, "unpack", 1)? as usize;
    if pos == 0 {
        return Err(fail(StructError::Arg(
            3,
            "offset must be 1 or greater".into(),
        )));
    }
    pos -= 1;
    let ld = data.len();
    let short = || StructError::Arg(2, "data string too short".into());
    let fits = |pos: usize, size: usize| size <= ld && pos <= ld - size;
    let mut f = Format { text: &fmt, at: 0 };
    let mut h = Header::default();
    let mut out: Vec<Value> = Vec::new();
    while let Some(opt) = f.next() {
        let mut size = f.size(opt).map_err(fail)?;
        pos = pos.wrapping_add(padding(pos, &h, opt, size));
        if !fits(pos, size) {
            return Err(fail(short()));
        }
        if out.len() >= MAX_RESULTS {
            return Err(Raised::library(lua, "stack overflow (too many results)"));
        }
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let n = read_integer(&data[pos..pos + size], h.little, opt.is_ascii_lowercase());
                out.push(Value::Number(n));
            }
            b'x' => {}
            b'f' => {
                let b = [data[pos], data[pos + 1], data[pos + 2], data[pos + 3]];
                let n = if h.little {
                    f32::from_le_bytes(b)
                } else {
                    f32::from_be_bytes(b)
                };
                out.push(Value::Number(f64::from(n)));
            }
            b'd' => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&data[pos..pos + 8]);
                let n = if h.little {
                    f64::from_le_bytes(b)
                } else {
                    f64::from_be_bytes(b)
                };
                out.push(Value::Number(n));
            }
            b'c' => {
                if size == 0 {
                    let prev = out
                        .last()
                        .and_then(|v| super::lib_args::to_number(lua, Some(v)));
                    let Some(n) = prev else {
                        return Err(fail(StructError::Plain(
                            "format 'c0' needs a previous size".into(),
                        )));
                    };
                    out.pop();
                    size = n as usize;
                    if !fits(pos, size) {
                        return Err(fail(short()));
                    }
                }
                out.push(Value::String(lua.create_string(&data[pos..pos + size])?));
            }
            b's' => {
                let Some(end) = data[pos..].iter().position(|&b| b == 0) else {
                    return Err(fail(StructError::Plain("unfinished string in data".into())));
                };
                size = end + 1;
                out.push(Value::String(lua.create_string(&data[pos..pos + end])?));
            }
            _ => f.control(opt, &mut h).map_err(fail)?,
        }
        pos = pos.wrapping_add(size);
    }
    out.push(Value::Number(pos.wrapping_add(1) as i64 as f64));
    Ok(out)
}

fn size(lua: &Lua, args: &[Value]) -> mlua::Result<f64> {
    let fmt = format_arg(lua, args, "size")?;
    let fail = |e: StructError| e.raise(lua, "size");
    let mut f = Format { text: &fmt, at: 0 };
    let mut h = Header::default();
    let mut pos: usize = 0;
    while let Some(opt) = f.next() {
        let size = f.size(opt).map_err(fail)?;
        pos = pos.wrapping_add(padding(pos, &h, opt, size));
        if opt == b's' {
            return Err(fail(StructError::Arg(
                1,
                "option 's' has no fixed size".into(),
            )));
        }
        if opt == b'c' && size == 0 {
            return Err(fail(StructError::Arg(
                1,
                "option 'c0' has no fixed size".into(),
            )));
        }
        // As in the C library, a letter it does not know adds nothing here.
        if !opt.is_ascii_alphanumeric() {
            f.control(opt, &mut h).map_err(fail)?;
        }
        pos = pos.wrapping_add(size);
    }
    Ok(pos as f64)
}

/// Builds the `struct` table.
pub(super) fn module(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set(
        "pack",
        lua.create_function(|lua, args: Variadic<Value>| lua.create_string(pack(lua, &args)?))?,
    )?;
    t.set(
        "unpack",
        lua.create_function(|lua, args: Variadic<Value>| {
            Ok(Variadic::from_iter(unpack(lua, &args)?))
        })?,
    )?;
    t.set(
        "size",
        lua.create_function(|lua, args: Variadic<Value>| size(lua, &args))?,
    )?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::{Header, padding, read_integer};

    #[test]
    fn integers_read_as_the_c_library_reads_them() {
        assert_eq!(read_integer(&[0xff], true, true), -1.0);
        assert_eq!(read_integer(&[0xff], true, false), 255.0);
        assert_eq!(read_integer(&[0x01, 0x02], false, false), 258.0);
        assert_eq!(read_integer(&[0x01, 0x02], true, false), 513.0);
        assert_eq!(read_integer(&[0x00, 0x80], true, true), -32768.0);
        assert_eq!(read_integer(&[0xff; 8], true, true), -1.0);
        assert_eq!(read_integer(&[0x7f, 0xff, 0xff], false, true), 8388607.0);
    }

    #[test]
    fn options_align_to_their_size_up_to_the_alignment() {
        let h = Header {
            little: true,
            align: 8,
        };
        assert_eq!(padding(1, &h, b'i', 4), 3);
        assert_eq!(padding(4, &h, b'd', 8), 4);
        assert_eq!(padding(3, &h, b'c', 4), 0);
        assert_eq!(padding(5, &Header::default(), b'd', 8), 0);
    }
}
