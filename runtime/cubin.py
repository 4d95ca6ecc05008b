"""Reading what a cubin says about itself: target SM, kernel symbols, parameter layout.

Standard library only (the before-stop hook and CI use it without a GPU). A cubin
is an ELF64 file; NVIDIA encodes the SM in ``e_flags`` (two layouts, told apart by
the ELF ABI version) and describes each kernel's parameters in the attribute list
of its ``.nv.info.<kernel>`` section (``EIATTR_KPARAM_INFO`` records); the kernel's
name the driver looks up is an entry of the ELF symbol table (``.symtab``).
"""

from __future__ import annotations

import itertools
import struct
from typing import NamedTuple

ELF_MAGIC = b"\x7fELF"
ET_EXEC = 2  # e_type of a linked cubin, what the driver loads
EM_CUDA = 190
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_REQNTID = 0x10  # the block shape the kernel was compiled for (.reqntid): three uint32
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EF_CUDA_ACCELERATORS_V1 = 0x800  # the "a" of sm_90a in the ABI-v1 flag layout
_EF_CUDA_ACCELERATORS_V2 = 0x8  # the "a" of sm_100a in the ABI-v2 flag layout
_SHDR = struct.Struct("<IIQQQQIIQQ")  # an ELF64 section header


class CubinFormatError(ValueError):
    """The bytes are not a CUDA ELF this module can read."""


# NamedTuples rather than dataclasses: ``import runtime`` is part of the measured cold start,
# and a frozen dataclass costs about 0.4 ms to define.
class KernelParam(NamedTuple):
    ordinal: int
    offset: int
    size: int


class CubinInfo(NamedTuple):
    sm: int  # e.g. 90, 100
    arch_specific: bool  # the "a" suffix (a flag bit in both ELF flag layouts)
    kernels: dict  # symbol -> tuple[KernelParam, ...] ordered by ordinal
    capmerc: dict  # the same of the capmerc image's lists (.nv.merc.nv.info.<symbol>, sm_100a; empty where none)

    def arch_matches(self, arch: str) -> bool:
        """Whether this cubin targets ``arch`` (e.g. "sm_90a")."""
        want_sm = int(arch[3:].rstrip("af"))
        if self.sm != want_sm:
            return False
        return self.arch_specific == arch.endswith("a")

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}" + ("a" if self.arch_specific else "")


def _check_elf(data: bytes) -> None:
    # ELF64 (class 2), little-endian (data 1), version 1: the header and section table are read as such, and a
    # crafted header of another encoding would otherwise reach the driver.
    if len(data) < 64 or data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1 or data[6] != 1:
        raise CubinFormatError("not a little-endian ELF64 file")
    elf_type, machine = struct.unpack_from("<HH", data, 0x10)
    if machine != EM_CUDA:
        raise CubinFormatError(f"ELF machine {machine} is not CUDA ({EM_CUDA})")
    # Every cubin the build writes is a linked executable; a relocatable object (nvcc -rdc -c, type 1) or any other
    # type is not a file it wrote. (e_version is not checked: NVIDIA encodes the toolkit in it, 129 in sm_90a's.)
    if elf_type != ET_EXEC:
        raise CubinFormatError(f"ELF type {elf_type} is not an executable cubin ({ET_EXEC}): a relocatable object "
                               f"or another kind of ELF, not a file the build writes")


def read_header(data: bytes) -> CubinInfo:
    """Only the ELF header: the SM, without parsing sections (``kernels`` is empty)."""
    _check_elf(data)
    sm, specific = _sm_of(data)
    return CubinInfo(sm, specific, {}, {})


def check_section_table(data: bytes, *, kernel: str | None = None) -> KernelAttributes | None:
    """The section and program headers and every section and segment lie inside the file, and every record of the
    attribute lists (``.nv.info`` and each ``.nv.info.<kernel>``, and their capmerc twins ``.nv.merc.nv.info*`` in an
    sm_100a cubin) inside its section (CubinFormatError if not).

    The loader runs it before handing the bytes to the driver, which does not bounds-check a crafted section
    table (seen: a hang, a segfault), and reads the attribute lists as it loads. Only the lists are walked, no other
    section. With ``kernel``: that kernel's ``kernel_attributes`` too (None: no list of it), from the same header
    parse, its list walked once (~10 us a list in Python, 0.4 ms of a 40-cubin load).
    """
    heads, shstrndx = _section_heads(data)
    strtab = heads[shstrndx][4]
    own = () if kernel is None else tuple(image + _info_name(kernel) for image in _IMAGES)  # () starts no name
    for h in heads:
        if data.startswith(_LISTS, strtab + h[0]) and not data.startswith(own, strtab + h[0]):
            for attr, value in _attributes(data[h[4] : h[4] + h[5]]):
                _is_param(attr, value)  # a short parameter record too: read as 12 bytes, it runs into the next
    return None if kernel is None else _own_attributes(data, heads, strtab, kernel)


# The images whose attribute lists the driver reads: the SASS image's (.nv.info*), and on sm_100a also the capmerc
# image's (.nv.merc.nv.info*), which describes the same kernel for the driver's finalizer.
_IMAGES = (b"", b".nv.merc")
_LISTS = tuple(image + b".nv.info" for image in _IMAGES)  # their sections' name prefixes: one startswith for both
_LIST_NAMES = tuple(prefix.decode() for prefix in _LISTS)  # the same, of a decoded name (read_cubin)


_PHDR_SIZE = 56  # ELF64's program header: type, flags, offset, vaddr, paddr, filesz, memsz, align


def _check_program_headers(data: bytes) -> None:
    """The program headers, by which the driver places the segments, and every segment's file bytes lie inside the
    file: as with the section table, the driver is not trusted to bounds-check a crafted one."""
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    if phnum == 0:
        return
    if phentsize != _PHDR_SIZE:
        raise CubinFormatError(f"program header size {phentsize} is not ELF64's {_PHDR_SIZE}")
    end = len(data)
    if phoff + phnum * _PHDR_SIZE > end:
        raise CubinFormatError("program headers run past the end of the file (truncated?)")
    for i in range(phnum):
        offset, _vaddr, _paddr, filesz = struct.unpack_from("<QQQQ", data, phoff + i * _PHDR_SIZE + 8)
        if offset + filesz > end:
            raise CubinFormatError("a segment runs past the end of the file (truncated?)")


def _section_heads(data: bytes) -> tuple[list, int]:
    """Every section header (name, type, flags, addr, offset, size, ...), bounds-checked, after the program
    headers (both tables reach the driver)."""
    _check_elf(data)
    _check_program_headers(data)
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    # Exactly ELF64's size: read at a wider stride, the table's gaps could hold headers that a reader assuming 64
    # bytes meets (cuobjdump refuses such a cubin).
    if shentsize != _SHDR.size:
        raise CubinFormatError(f"section header size {shentsize} is not ELF64's {_SHDR.size}")
    if shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise CubinFormatError("section headers run past the end of the file (truncated?)")
    heads = list(_SHDR.iter_unpack(data[shoff : shoff + shnum * shentsize]))
    # The names too: the driver finds the attribute lists by them, and a name offset past its string table (or a
    # table whose last name has no NUL in it) would have it read past the table, or the file, unchecked.
    end, names = len(data), heads[shstrndx]
    names_size = names[5]
    for h in heads:
        if h[1] != 8 and h[4] + h[5] > end:  # 8 = SHT_NOBITS
            raise CubinFormatError("a section runs past the end of the file (truncated?)")
        if h[0] >= names_size:
            raise CubinFormatError("a section's name lies past the section names' string table")
    if names[1] == 8 or data[names[4] + names[5] - 1] != 0:  # inside the file: checked above (a size > 0 here)
        raise CubinFormatError("the section names' string table does not end in a NUL (truncated?)")
    _check_attribute_list_sections(data, heads, names[4])
    return heads, shstrndx


# The section type of each image's attribute lists: SHT_CUDA_INFO, and the capmerc image's (every committed cubin's).
_LIST_TYPE, _MERC_LIST_TYPE = 0x70000000, 0x70000083


def _check_attribute_list_sections(data: bytes, heads, strtab: int) -> None:
    """Each attribute list (found by name, as the driver and cuobjdump find them) is a section of its image's list
    type, and no two lists share bytes. Of another type it could be SHT_NOBITS, whose bounds are not checked (a list
    declared to run past the file), and cuobjdump refuses any other; overlapping lists are walked once a header,
    so a few MiB of headers on one list held a load's check for hours."""
    spans = []
    for h in heads:
        at = strtab + h[0]
        if not data.startswith(_LISTS, at):  # one test for both images' names (the load path runs this per cubin)
            continue
        want = _MERC_LIST_TYPE if data.startswith(_IMAGES[1], at) else _LIST_TYPE
        if h[1] != want:
            raise CubinFormatError(f"an attribute list's section is of type {h[1]:#x}, not {want:#x}")
        if h[5]:
            spans.append((h[4], h[4] + h[5]))
    spans.sort()
    if any(start < end for (_, end), (start, _) in itertools.pairwise(spans)):
        raise CubinFormatError("two attribute lists share bytes")


def _sections(data: bytes):
    """Every section's name (two of one name refused) and the bytes of each attribute list of both images (.nv.info*,
    .nv.merc.nv.info*) by name, all that read_cubin reads. Linear in the file: a name must be a whole entry of its
    table (at its start or after a NUL), so the names at distinct offsets share no bytes and a repeated offset is
    refused as a repeated name; and only the lists, which share no bytes either (_section_heads), are copied.
    Suffixes of one long name (no cubin shares them) gave 65535 headers distinct names of the run's length, and a copy
    of every section held 65535 copies of the file: a 1.1 MB cubin took 17 GB."""
    heads, shstrndx = _section_heads(data)
    strtab = heads[shstrndx][4]
    names, lists = set(), {}
    for h in heads:
        at = strtab + h[0]
        if h[0] and data[at - 1]:  # inside the file and the table: _section_heads
            raise CubinFormatError("a section's name starts inside another name (a suffix of it)")
        try:
            section = data[at : data.index(b"\0", at)].decode()
        except ValueError:  # not UTF-8 (its NUL lies inside the table: _section_heads)
            raise CubinFormatError("a section name is unreadable (truncated?)") from None
        if section in names:  # a dict would keep the last of two, _kernel_info reads the first
            raise CubinFormatError(f"two sections named {section}")
        names.add(section)
        if section.startswith(_LIST_NAMES):
            lists[section] = data[h[4] : h[4] + h[5]]
    return lists


def _sm_of(data: bytes) -> tuple[int, bool]:
    abi_version = data[8]
    (flags,) = struct.unpack_from("<I", data, 0x30)
    if abi_version == 7:  # layout v1: SM in the low byte, "a" as a flag bit
        return flags & 0xFF, bool(flags & _EF_CUDA_ACCELERATORS_V1)
    if abi_version == 8:  # layout v2: SM in bits 8..15, "a" as a flag bit
        return (flags >> 8) & 0xFF, bool(flags & _EF_CUDA_ACCELERATORS_V2)
    raise CubinFormatError(f"unknown CUDA ELF ABI version {abi_version}")


def _attributes(info: bytes):
    """(attribute, value) of each record of a ``.nv.info`` section, in order."""
    i = 0
    # Records lie on a 4-byte grid, as NVIDIA's tools read them (cuobjdump: a no-value record takes 4 bytes, and a
    # value's size off the grid is "wrong size"). Read as 2 bytes, a no-value record shifted every later record by 2,
    # so a crafted list hid a parameter record inside a longer one from the count the loader checks.
    while i < len(info):
        if i + 4 > len(info):
            raise CubinFormatError("a .nv.info attribute runs past its section (truncated?)")
        fmt, attr = info[i], info[i + 1]
        if fmt == _EIFMT_SVAL:
            size = info[i + 2] | info[i + 3] << 8
            if size % 4:
                raise CubinFormatError(f"a .nv.info attribute of {size} bytes is off the 4-byte grid")
            if i + 4 + size > len(info):  # the value too: the slice would read it short and go on
                raise CubinFormatError("a .nv.info attribute runs past its section (truncated?)")
            value = info[i + 4 : i + 4 + size]
            i += 4 + size
        elif fmt in (_EIFMT_BVAL, _EIFMT_HVAL):
            value = info[i + 2 : i + 4]
            i += 4
        elif fmt == _EIFMT_NVAL:  # no value: two bytes of padding
            value = b""
            i += 4
        else:
            raise CubinFormatError(f"unknown .nv.info attribute format {fmt}")
        yield attr, value


def _is_param(attr: int, value: bytes) -> bool:
    """A parameter's record. One shorter than its 12 bytes is refused: skipped, it went uncounted while the driver
    may count it, so a kernel of one more parameter than the manifest lists would have passed the count check."""
    if attr != _EIATTR_KPARAM_INFO:
        return False
    if len(value) < 12:
        raise CubinFormatError(f"a kernel parameter's record is {len(value)} bytes, not 12")
    return True


def _kernel_params(info: bytes) -> tuple[KernelParam, ...]:
    params = []
    for attr, value in _attributes(info):
        if _is_param(attr, value):
            _index, ordinal, offset, bits = struct.unpack_from("<IHHI", value)
            params.append(KernelParam(ordinal, offset, (bits >> 18) & 0x3FFF))
    return tuple(sorted(params, key=lambda p: p.ordinal))


class KernelAttributes(NamedTuple):
    param_count: int  # parameters in the attribute list
    required_block: tuple | None  # (x, y, z) the kernel was compiled for (EIATTR_REQNTID), or None where it names none


def kernel_attributes(data: bytes, symbol: str) -> KernelAttributes | None:
    """What the ELF's attribute list says of kernel ``symbol`` (None: no such list), in one pass over it.

    Reads only the section headers and that kernel's ``.nv.info.<symbol>`` section. The loader pins the
    parameter count with it, which ``cuFuncGetParamInfo`` alone cannot (CUDA 13.0, the H200's driver 580,
    has no ``cuFuncGetParamCount``, and probing past the last index is a failing API call that sanitizers
    report), and compares the required block shape with the manifest's threads, since the driver refuses a
    launch of another shape.
    """
    heads, shstrndx = _section_heads(data)
    return _own_attributes(data, heads, heads[shstrndx][4], symbol)


def _own_attributes(data: bytes, heads, strtab: int, symbol: str) -> KernelAttributes | None:
    """kernel_attributes of ``symbol`` from its SASS image's list; where the cubin also carries a capmerc image's list
    of it (sm_100a), that list must say the same, since the manifest's checks read only the first."""
    attributes = _attributes_of(_kernel_info(data, heads, strtab, symbol), symbol)
    merc = _attributes_of(_kernel_info(data, heads, strtab, symbol, image=b".nv.merc"), symbol)
    if merc is not None and merc != attributes:
        raise CubinFormatError(f"kernel {symbol}'s capmerc attribute list (.nv.merc.nv.info) says {_said(merc)}, its "
                               f".nv.info list {_said(attributes)}")
    return attributes


def _said(attributes: KernelAttributes | None) -> str:
    if attributes is None:
        return "nothing (no list)"
    return f"{attributes.param_count} parameters, block {attributes.required_block}"


def _attributes_of(info: bytes | None, symbol: str) -> KernelAttributes | None:
    """kernel_attributes of kernel ``symbol``'s attribute list ``info`` (None where it has none), in one pass."""
    if info is None:
        return None
    count, required = 0, None
    for attr, value in _attributes(info):
        if _is_param(attr, value):
            count += 1
        elif attr == _EIATTR_REQNTID:
            if len(value) != 12:
                raise CubinFormatError(f"kernel {symbol}'s required block shape is {len(value)} bytes, not 12")
            required = struct.unpack("<III", value)
    return KernelAttributes(count, required)


def _info_name(symbol: str) -> bytes:
    """The name of kernel ``symbol``'s attribute-list section in the string table, with its terminating NUL."""
    return b".nv.info." + symbol.encode() + b"\0"


def _kernel_info(data: bytes, heads, strtab: int, symbol: str, image: bytes = b"") -> bytes | None:
    """The ``.nv.info.<symbol>`` section of the ELF (its attribute list; ``image`` b".nv.merc": the capmerc image's),
    found by the section headers ``heads`` (``_section_heads``') and the offset of their string table."""
    name = image + _info_name(symbol)
    found = [h for h in heads if data.startswith(name, strtab + h[0])]
    if len(found) > 1:  # read_cubin's dict kept the last, this the first: a decoy could hide a parameter from either
        raise CubinFormatError(f"two sections named {image.decode()}.nv.info.{symbol}")
    return data[found[0][4] : found[0][4] + found[0][5]] if found else None


def read_cubin(data: bytes) -> CubinInfo:
    """Parse a cubin: its SM and, for every kernel, the parameter layout (of each image's attribute lists)."""
    sections = _sections(data)
    sm, specific = _sm_of(data)
    return CubinInfo(sm, specific, _layouts(sections, ".nv.info."), _layouts(sections, ".nv.merc.nv.info."))


def _layouts(lists: dict, prefix: str) -> dict:
    """symbol -> parameter layout of each attribute list in ``lists`` (name -> bytes) whose name starts with
    ``prefix`` (".nv.info." does not match a capmerc list's ".nv.merc.nv.info.")."""
    return {n[len(prefix) :]: _kernel_params(body) for n, body in lists.items() if n.startswith(prefix)}


# --- the symbol table: where the driver looks a kernel up by name ------------------------------------------------

_SYM = struct.Struct("<IBBHQQ")  # an ELF64 symbol: name, info (binding << 4 | type), other, section, value, size
_SHT_SYMTAB, _SHT_STRTAB = 2, 3
_SHN_LORESERVE = 0xFF00  # st_shndx from here on is reserved (SHN_ABS, SHN_COMMON, ...), naming no section
STT_FUNC = 2
STB_GLOBAL, STB_WEAK = 1, 2


class ElfSymbol(NamedTuple):
    binding: int  # STB_LOCAL 0, STB_GLOBAL 1, STB_WEAK 2 (every committed kernel's: global)
    type: int  # STT_FUNC 2 for a kernel
    section: int  # st_shndx as written
    defined: bool  # ``section`` names a section of the ELF (not SHN_UNDEF 0, a reserved index, or one past the table)


def symbol_table_entries(data: bytes, symbol: str) -> tuple[ElfSymbol, ...] | None:
    """Every entry of the ELF's symbol table (its one SHT_SYMTAB section, .symtab) named ``symbol``, in table order;
    None where the ELF has no symbol table.

    The driver looks a kernel up by name in the symbol table, while the attribute lists name it only by their
    sections' names, which a cubin can carry for a symbol it does not define. The names are read through the table's
    sh_link (its string table), every offset bounds-checked (CubinFormatError); each entry's name is compared with
    ``symbol`` where it lies, not decoded, since ELF names may share bytes (one name a suffix of another): decoding
    each would be quadratic in the file, comparing is linear.
    """
    heads, _ = _section_heads(data)
    tables = [h for h in heads if h[1] == _SHT_SYMTAB]
    if not tables:
        return None
    if len(tables) > 1:  # ELF allows one: a reader taking the first and one taking the last would disagree
        raise CubinFormatError(f"{len(tables)} symbol tables (SHT_SYMTAB sections), ELF allows one")
    _name, _type, _flags, _addr, offset, size, link, _info, _align, entsize = tables[0]
    if entsize != _SYM.size:
        raise CubinFormatError(f"symbol table entry size {entsize} is not ELF64's {_SYM.size}")
    if size % _SYM.size:
        raise CubinFormatError(f"the symbol table's {size} bytes are not whole {_SYM.size}-byte entries (truncated?)")
    names, names_size = _string_table(data, heads, link)
    want = symbol.encode() + b"\0"
    if b"\0" in want[:-1]:  # no ELF name holds a NUL
        return ()
    found = []
    # Inside the file: a SHT_SYMTAB section is no SHT_NOBITS, whose bounds _section_heads checks.
    for name, info, _other, section, _value, _size in _SYM.iter_unpack(memoryview(data)[offset : offset + size]):
        if name >= names_size:
            raise CubinFormatError("a symbol's name lies past its string table")
        # A match ends at the table's first NUL from ``name`` on: inside the table, which ends in one.
        if data.startswith(want, names + name):
            defined = 0 < section < min(len(heads), _SHN_LORESERVE)
            found.append(ElfSymbol(info >> 4, info & 0xF, section, defined))
    return tuple(found)


def _string_table(data: bytes, heads, index: int) -> tuple[int, int]:
    """The file offset and size of the string table that section ``index`` is (a symbol table's sh_link): a
    SHT_STRTAB section that ends in a NUL, so that every name read from it ends inside it (CubinFormatError if not)."""
    if index >= len(heads) or heads[index][1] != _SHT_STRTAB:
        raise CubinFormatError(f"the symbol table's string table (section {index}) is no string table section")
    offset, size = heads[index][4], heads[index][5]
    if size == 0 or data[offset + size - 1] != 0:  # inside the file: SHT_STRTAB is no SHT_NOBITS (_section_heads)
        raise CubinFormatError("the symbol table's string table does not end in a NUL (truncated?)")
    return offset, size
