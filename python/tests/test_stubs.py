"""The type stubs (qkv/_qkv.pyi, beside the imported module) against the module itself.

Both name the same public functions and classes, each class the same members; every function's
and method's parameters in the stubs (names, positional or keyword-only, defaults) are those of
the signature pybind11 writes at the top of its docstring; every function, class, method and
property has a docstring, and help(qkv.attention) shows each option with its default.
"""
import ast
import pathlib
import pydoc
import re

import pytest

import qkv
from qkv import _qkv

STUB_PATH = pathlib.Path(_qkv.__file__).with_name("_qkv.pyi")
CLASSES = ["Tensor", "Model", "Tokenizer"]
# What every class has from Python or pybind11 itself, not from a binding.
INHERITED = {"__doc__", "__module__", "__dict__", "__weakref__", "__init__", "__new__", "__buffer__",
             "__release_buffer__"}


# ---------------------------------------------------------------- the module's side
def split_top_level(text):
    """text split at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def docstring_parameters(func):
    """[(name, kind, default text or None)] of the signature pybind11 wrote first in func.__doc__;
    kind is 'positional' or 'keyword' (after a bare *)."""
    first = func.__doc__.splitlines()[0]
    name = func.__name__
    assert first.startswith(name + "("), f"{name}: no pybind11 signature in its docstring: {first!r}"
    # The parameter list ends at the ')' that closes the opening '('.
    depth = 0
    for end, c in enumerate(first):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and c == ")":
            break
    params, kind = [], "positional"
    for p in split_top_level(first[len(name) + 1:end]):
        if p == "*":
            kind = "keyword"
            continue
        head, _, default = p.partition(" = ")
        params.append((head.split(":")[0].strip(), kind, default or None))
    return params


def doc_text(obj):
    """The docstring without pybind11's signature line."""
    lines = (obj.__doc__ or "").splitlines()
    if lines and re.match(r"^\w+\(.*\)( -> .*)?$", lines[0]):
        lines = lines[1:]
    return "\n".join(lines).strip()


def module_members(cls):
    """The members a class's bindings define: its methods, properties and protocol methods (dunders);
    pybind11's own (_pybind11_conduit_v1_, ...) start with one underscore."""
    return {n for n in vars(cls) if n not in INHERITED and (not n.startswith("_") or n.endswith("__"))}


def public_names(module):
    return {n for n in dir(module) if not n.startswith("_")}


# ---------------------------------------------------------------- the stubs' side
def stub_tree(text=None):
    return ast.parse(STUB_PATH.read_text() if text is None else text)


def stub_parameters(fn):
    """[(name, kind, default text or None)] of a stub's def, as docstring_parameters gives them."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    params = [(p.arg, "positional", d) for p, d in zip(positional, defaults)]
    params += [(p.arg, "keyword", None if d is None else ast.unparse(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return params


def stub_index(tree):
    """{name: node} of the stubs' public top-level defs and classes, and {class: {member: [defs]}}."""
    top, members = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            top[node.name] = node
        if isinstance(node, ast.ClassDef):
            members[node.name] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[node.name].setdefault(item.name, []).append(item)
    return top, members


def same_default(stub, doc):
    """Whether a stub's default and pybind11's spelling of it are the same value."""
    if stub is None or doc is None:
        return stub is doc
    try:
        a, b = ast.literal_eval(stub), ast.literal_eval(doc)
    except (ValueError, SyntaxError):
        return stub == doc
    # () and [] both stand for an empty sequence (pybind11 writes a std::vector default as a list).
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return type(a) is type(b) and a == b


def mismatches(tree):
    """Every difference between the stubs' tree and the module, one line each."""
    problems = []
    top, members = stub_index(tree)
    module_names = public_names(_qkv)
    for n in sorted(module_names - set(top)):
        problems.append(f"{n}: in the module, not in the stubs")
    for n in sorted(set(top) - module_names):
        problems.append(f"{n}: in the stubs, not in the module")

    def compare(func, stub_def, where):
        got, want = stub_parameters(stub_def), docstring_parameters(func)
        if [(n, k) for n, k, _ in got] != [(n, k) for n, k, _ in want]:
            problems.append(f"{where}: stub parameters {got} != module's {want}")
            return
        for (n, _, d_stub), (_, _, d_doc) in zip(got, want):
            if not same_default(d_stub, d_doc):
                problems.append(f"{where}: default of {n} is {d_stub} in the stubs, {d_doc} in the module")

    for n in sorted(module_names & set(top)):
        obj = getattr(_qkv, n)
        if isinstance(top[n], ast.FunctionDef):
            compare(obj, top[n], n)
    for cls in CLASSES:
        have, stubbed = module_members(getattr(_qkv, cls)), set(members.get(cls, {}))
        for m in sorted(have - stubbed):
            problems.append(f"{cls}.{m}: in the module, not in the stubs")
        for m in sorted(stubbed - have):
            problems.append(f"{cls}.{m}: in the stubs, not in the module")
        for m in sorted(have & stubbed):
            member = vars(getattr(_qkv, cls))[m]
            if not isinstance(member, property):
                compare(member, members[cls][m][0], f"{cls}.{m}")
    return problems


# ---------------------------------------------------------------- the tests
def test_stubs_name_what_the_module_has_with_the_same_parameters():
    assert mismatches(stub_tree()) == []


def test_the_comparison_sees_a_wrong_stub():
    """The checker itself: a renamed parameter, a changed default, a missing and an extra name."""
    text = STUB_PATH.read_text()
    cases = {
        "renamed": (text.replace("def logits(self, ids: _Ids)", "def logits(self, tokens: _Ids)"), "logits"),
        "default": (text.replace("    window: int = 0,\n", "    window: int = 1,\n", 1), "default of window"),
        "missing": (re.sub(r"\ndef consistency\(.*\n", "\n", text), "consistency: in the module"),
        "extra": (text + "\ndef flash(q: int) -> int: ...\n", "flash: in the stubs"),
        "member": (text.replace("    def clone(self) -> Tensor: ...\n", ""), "Tensor.clone"),
    }
    for name, (wrong, expected) in cases.items():
        assert wrong != text, name
        found = mismatches(stub_tree(wrong))
        assert any(expected in line for line in found), (name, found)


def test_the_package_exports_the_module():
    assert public_names(_qkv) <= public_names(qkv)


def test_version_is_the_one_pyproject_declares():
    # Read here from the file, independently of the build's own reading (CMakeLists.txt).
    source = pathlib.Path(__file__).resolve().parents[2]
    declared = re.search(r'^version = "([^"]+)"$', (source / "pyproject.toml").read_text(), re.M).group(1)
    assert qkv.__version__ == _qkv.__version__ == declared
    assert "__version__: str" in STUB_PATH.read_text()


def test_every_function_class_method_and_property_has_a_docstring():
    missing = []
    for n in sorted(public_names(_qkv)):
        obj = getattr(_qkv, n)
        if not doc_text(obj):
            missing.append(n)
    for cls in CLASSES:
        for m in sorted(module_members(getattr(_qkv, cls))):
            if not doc_text(vars(getattr(_qkv, cls))[m]):
                missing.append(f"{cls}.{m}")
    assert missing == []


@pytest.mark.parametrize("name", ["attention", "attention_vjp", "gradcheck_attention"])
def test_help_of_attention_names_every_option_with_its_default(name):
    text = pydoc.render_doc(getattr(qkv, name))
    options = {"scale": "None", "causal": "False", "window": "0", "key_padding": "None", "key_lengths": "None",
               "allow_mask": "None", "bias": "None", "alibi_slopes": "None", "segment_ids": "None",
               "pattern": "None", "dropout_p": "0.0", "dropout_seed": "0", "dropout_offset": "0",
               "fully_masked": "'zero'", "kernel": "'fused'", "check_invariants": "False"}
    for option, default in options.items():
        assert re.search(rf"\b{option}: [^,=]+ = {re.escape(default)}[,)]", text), (option, text)
