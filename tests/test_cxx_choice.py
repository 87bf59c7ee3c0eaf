"""The AOTInductor wrapper compiler is chosen by the libstdc++ it links, named as the loader sees it."""
from pathlib import Path

from atom_aot.build.cxx import libstdcxx_match


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    """usr/lib/libstdc++.so.6.0.33 with a symlinked folder lib -> usr/lib, as on Debian/Ubuntu merged /usr."""
    real_dir = tmp_path / "usr" / "lib"
    real_dir.mkdir(parents=True)
    real = real_dir / "libstdc++.so.6.0.33"
    real.write_bytes(b"\x7fELF")
    (real_dir / "libstdc++.so.6").symlink_to(real.name)
    (tmp_path / "lib").symlink_to(real_dir)
    return real_dir, tmp_path / "lib"


def test_same_folder_by_name_is_exact(tmp_path):
    real_dir, _ = _layout(tmp_path)
    assert libstdcxx_match(real_dir / "libstdc++.so.6", real_dir / "libstdc++.so.6.0.33") == "exact"


def test_reaching_the_file_through_a_symlinked_folder_is_only_resolved(tmp_path):
    real_dir, linked_dir = _layout(tmp_path)
    assert libstdcxx_match(linked_dir / "libstdc++.so.6", real_dir / "libstdc++.so.6.0.33") == "resolved"


def test_another_file_or_nothing_is_none(tmp_path):
    real_dir, _ = _layout(tmp_path)
    other = tmp_path / "opt" / "libstdc++.so.6"
    other.parent.mkdir()
    other.write_bytes(b"\x7fELF")
    assert libstdcxx_match(other, real_dir / "libstdc++.so.6.0.33") == "none"
    assert libstdcxx_match(None, real_dir / "libstdc++.so.6.0.33") == "none"
    assert libstdcxx_match(other, None) == "none"
