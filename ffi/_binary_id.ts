/**
 * Reads the build identity a linker stamps into a shared library: the GNU build-id note of an
 * ELF file (Linux) or the LC_UUID load command of a Mach-O file (macOS). Pure: takes bytes.
 */

const PT_NOTE = 4;
const NT_GNU_BUILD_ID = 3;
const MH_MAGIC_64 = 0xfeedfacf;
const LC_UUID = 0x1b;

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Returns the build id as lowercase hex, or null if the file carries none we can read. */
export function readBinaryId(file: Uint8Array): string | null {
  if (file.length < 64) return null;
  const view = new DataView(file.buffer, file.byteOffset, file.byteLength);
  if (file[0] === 0x7f && file[1] === 0x45 && file[2] === 0x4c && file[3] === 0x46) {
    return readElfBuildId(file, view);
  }
  if (view.getUint32(0, true) === MH_MAGIC_64) return readMachOUuid(file, view);
  return null;
}

function readElfBuildId(file: Uint8Array, view: DataView): string | null {
  if (file[4] !== 2 || file[5] !== 1) return null; // 64-bit little-endian only
  const phoff = Number(view.getBigUint64(0x20, true));
  const phentsize = view.getUint16(0x36, true);
  const phnum = view.getUint16(0x38, true);
  for (let i = 0; i < phnum; i++) {
    const ph = phoff + i * phentsize;
    if (ph + 56 > file.length || view.getUint32(ph, true) !== PT_NOTE) continue;
    const offset = Number(view.getBigUint64(ph + 8, true));
    const size = Number(view.getBigUint64(ph + 32, true));
    let p = offset;
    while (p + 12 <= Math.min(offset + size, file.length)) {
      const nameSize = view.getUint32(p, true);
      const descSize = view.getUint32(p + 4, true);
      const type = view.getUint32(p + 8, true);
      const nameStart = p + 12;
      const descStart = nameStart + Math.ceil(nameSize / 4) * 4;
      const name = new TextDecoder().decode(file.subarray(nameStart, nameStart + nameSize - 1));
      if (type === NT_GNU_BUILD_ID && name === "GNU") {
        return hex(file.subarray(descStart, descStart + descSize));
      }
      p = descStart + Math.ceil(descSize / 4) * 4;
    }
  }
  return null;
}

function readMachOUuid(file: Uint8Array, view: DataView): string | null {
  const ncmds = view.getUint32(16, true);
  let p = 32;
  for (let i = 0; i < ncmds && p + 8 <= file.length; i++) {
    const cmd = view.getUint32(p, true);
    const size = view.getUint32(p + 4, true);
    if (cmd === LC_UUID) return hex(file.subarray(p + 8, p + 24));
    if (size === 0) return null;
    p += size;
  }
  return null;
}
