"""Writes an empty Windows registry hive (a regf file): one root key, nothing else.

Why a container image needs them: the base layer of a Windows image carries
the five hives of Files/Windows/System32/config (DEFAULT, SAM, SECURITY,
SOFTWARE, SYSTEM), which the runtime's base-layer processing opens when it
imports the layer; since Windows Server 2025 they must be valid hives, no
longer empty files. A HostProcess container never reads them: it runs on the
host's own registry.

The file, in the regf format (as documented by the libyal project's "Windows
NT Registry File (REGF) format" and read by hivex), all integers little-endian:

  base block, 4096 bytes: "regf", primary and secondary sequence numbers
    equal (the hive was written completely), format version 1.5, a primary
    file in direct-memory-load format, the root cell's offset, the size of
    the hive bins, a checksum at offset 508 (the XOR of the 127 u32 before it)
  one hive bin, 4096 bytes: its "hbin" header (32 bytes), then cells, each a
    signed i32 size (negative: in use) rounded up to 8 bytes:
      nk  the root key: KEY_HIVE_ENTRY | KEY_NO_DELETE | KEY_COMP_NAME, no
          parent (0xFFFFFFFF), no subkeys, no values, no class, the sk below
      sk  its security: a self-relative security descriptor (owner
          BUILTIN\\Administrators, group SYSTEM; DACL: Administrators and
          SYSTEM full control, Everyone read, inherited by subkeys), linked
          to itself (the only one in the hive), referenced once
      the rest of the bin, one free cell
Offsets of cells count from the first hive bin (file offset 4096).

The bytes depend only on the key's name and the timestamp given, so an
image that holds them is reproducible.

Standard library only. Tested with hivex (hivexsh) in tests/chart/image.rs.
"""

import struct

BLOCK = 4096
NIL = 0xFFFFFFFF

# Key node flags (the regf format's nk flags).
KEY_HIVE_ENTRY = 0x0004
KEY_NO_DELETE = 0x0008
KEY_COMP_NAME = 0x0020

# Access masks (winnt.h).
KEY_ALL_ACCESS = 0x000F003F
KEY_READ = 0x00020019
CONTAINER_INHERIT_ACE = 0x02
ACCESS_ALLOWED_ACE_TYPE = 0x00
SE_DACL_PRESENT = 0x0004
SE_SELF_RELATIVE = 0x8000

# Well-known SIDs: (identifier authority, sub-authorities).
ADMINISTRATORS = (5, [32, 544])  # S-1-5-32-544
LOCAL_SYSTEM = (5, [18])  # S-1-5-18
EVERYONE = (1, [0])  # S-1-1-0


def filetime(epoch_seconds):
    """Seconds since 1970 as a Windows FILETIME (100 ns ticks since 1601)."""
    return (int(epoch_seconds) + 11644473600) * 10_000_000


def sid(authority, subs):
    """A binary SID: revision 1, the count, a 48-bit big-endian authority, u32 sub-authorities."""
    return struct.pack("<BB", 1, len(subs)) + authority.to_bytes(6, "big") + b"".join(struct.pack("<I", s) for s in subs)


def security_descriptor():
    """The self-relative security descriptor of the root key (see the module's docstring)."""
    aces = b""
    for who, mask in ((ADMINISTRATORS, KEY_ALL_ACCESS), (LOCAL_SYSTEM, KEY_ALL_ACCESS), (EVERYONE, KEY_READ)):
        body = struct.pack("<I", mask) + sid(*who)
        aces += struct.pack("<BBH", ACCESS_ALLOWED_ACE_TYPE, CONTAINER_INHERIT_ACE, 4 + len(body)) + body
    dacl = struct.pack("<BBHHH", 2, 0, 8 + len(aces), 3, 0) + aces
    owner = sid(*ADMINISTRATORS)
    group = sid(*LOCAL_SYSTEM)
    header = 20
    dacl_at = header
    owner_at = dacl_at + len(dacl)
    group_at = owner_at + len(owner)
    return (
        struct.pack("<BBHIIII", 1, 0, SE_SELF_RELATIVE | SE_DACL_PRESENT, owner_at, group_at, 0, dacl_at)
        + dacl
        + owner
        + group
    )


def cell(body):
    """A cell in use: its negative size (including the 4-byte size), padded to 8 bytes."""
    size = (4 + len(body) + 7) & ~7
    return struct.pack("<i", -size) + body + b"\0" * (size - 4 - len(body))


def hive(root_name, epoch_seconds=0, file_name=""):
    """The bytes of an empty hive whose root key is root_name (ASCII, 1..255 bytes).

    file_name goes into the base block's file name field (its last 31
    characters, UTF-16LE), which Windows only displays. Raises ValueError on
    a name that is not ASCII or is too long.
    """
    name = root_name.encode("ascii")
    if not 0 < len(name) < 256:
        raise ValueError(f"a key name is 1..255 characters, got {root_name!r}")
    stamp = filetime(epoch_seconds)

    nk_at = 32  # first cell, after the hive bin's header
    nk_len = (4 + 76 + len(name) + 7) & ~7
    sk_at = nk_at + nk_len
    sd = security_descriptor()
    nk = (
        b"nk"
        + struct.pack("<H", KEY_HIVE_ENTRY | KEY_NO_DELETE | KEY_COMP_NAME)
        + struct.pack("<Q", stamp)
        + struct.pack("<I", 0)  # access bits
        + struct.pack("<I", NIL)  # parent: none, the root
        + struct.pack("<II", 0, 0)  # subkeys, volatile subkeys
        + struct.pack("<II", NIL, NIL)  # their lists
        + struct.pack("<II", 0, NIL)  # values, their list
        + struct.pack("<I", sk_at)  # security
        + struct.pack("<I", NIL)  # class name
        + struct.pack("<IIII", 0, 0, 0, 0)  # largest subkey name, class, value name, value data
        + struct.pack("<I", 0)  # work var
        + struct.pack("<HH", len(name), 0)  # name length, class name length
        + name
    )
    sk = b"sk" + struct.pack("<HIIII", 0, sk_at, sk_at, 1, len(sd)) + sd
    cells = cell(nk) + cell(sk)
    assert len(cell(nk)) == nk_len
    free = BLOCK - 32 - len(cells)
    if free < 8:
        raise ValueError(f"key name {root_name!r} leaves no room in one hive bin")
    hbin = b"hbin" + struct.pack("<IIQQI", 0, BLOCK, 0, stamp, 0) + cells + struct.pack("<i", free) + b"\0" * (free - 4)
    assert len(hbin) == BLOCK

    fname = file_name[-31:].encode("utf-16-le")
    base = bytearray(BLOCK)
    struct.pack_into("<4sIIQIIIIIII", base, 0, b"regf", 1, 1, stamp, 1, 5, 0, 1, nk_at, BLOCK, 1)
    base[48 : 48 + len(fname)] = fname
    checksum = 0
    for (word,) in struct.iter_unpack("<I", bytes(base[:508])):
        checksum ^= word
    if checksum == NIL:
        checksum = NIL - 1
    elif checksum == 0:
        checksum = 1
    struct.pack_into("<I", base, 508, checksum)
    return bytes(base) + hbin


# The hives a Windows base layer carries, by file name.
BASE_LAYER_HIVES = ("DEFAULT", "SAM", "SECURITY", "SOFTWARE", "SYSTEM")
