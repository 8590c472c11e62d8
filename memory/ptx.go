package memory

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// paramKind is the class of a kernel parameter or argument: what Launch
// compares before it hands the arguments to the driver.
type paramKind uint8

const (
	paramInt   paramKind = iota + 1 // .u/.s: integers (and pointers, as .u64)
	paramFloat                      // .f
	paramBits                       // .b: untyped, takes any value of its size
)

// ptxParam is one parameter of a PTX entry: its class and its size in bytes
// (an array parameter such as .b8 x[16] has the element's class and the
// array's size).
type ptxParam struct {
	kind paramKind
	size int
	typ  string // as written: ".u64", ".b8[16]"
}

// isPTX reports whether a module image is PTX text rather than a cubin (an
// ELF file) or a fatbin: text without NUL bytes that declares a .version.
func isPTX(image []byte) bool {
	return !bytes.HasPrefix(image, []byte("\x7fELF")) && bytes.IndexByte(image, 0) < 0 &&
		utf8.Valid(image) && bytes.Contains(image, []byte(".version"))
}

// ptxEntries reads the parameter lists of every .entry in PTX text. An
// entry whose list it cannot read maps to nil: its launches are not
// checked (the driver loads what it understands; this reader only knows
// the scalar and array forms that compilers emit).
func ptxEntries(ptx string) map[string][]ptxParam {
	src := stripPTXComments(ptx)
	out := map[string][]ptxParam{}
	for {
		i := indexToken(src, ".entry")
		if i < 0 {
			return out
		}
		src = strings.TrimLeft(src[i+len(".entry"):], " \t\r\n")
		n := 0
		for n < len(src) && isPTXIdent(src[n]) {
			n++
		}
		if n == 0 {
			continue
		}
		name := src[:n]
		src = strings.TrimLeft(src[n:], " \t\r\n")
		if !strings.HasPrefix(src, "(") {
			out[name] = []ptxParam{} // no parameter list: no parameters
			continue
		}
		end := strings.IndexByte(src, ')')
		if end < 0 {
			out[name] = nil
			return out
		}
		out[name] = parsePTXParams(src[1:end])
		src = src[end+1:]
	}
}

// parsePTXParams reads "  .param .u64 a, .param .align 8 .b8 b[16]"; nil if
// any parameter is in a form it does not know.
func parsePTXParams(list string) []ptxParam {
	ps := []ptxParam{}
	if strings.TrimSpace(list) == "" {
		return ps
	}
	for _, decl := range strings.Split(list, ",") {
		p, ok := parsePTXParam(strings.Fields(decl))
		if !ok {
			return nil
		}
		ps = append(ps, p)
	}
	return ps
}

func parsePTXParam(f []string) (ptxParam, bool) {
	if len(f) < 3 || f[0] != ".param" {
		return ptxParam{}, false
	}
	var p ptxParam
	for i := 1; i < len(f)-1; i++ {
		switch t := f[i]; {
		case t == ".align":
			i++ // its operand
		case t == ".ptr" || t == ".global" || t == ".const" || t == ".local" || t == ".shared":
		case p.kind == 0 && len(t) >= 3 && t[0] == '.' && strings.ContainsRune("usfb", rune(t[1])):
			bits, err := strconv.Atoi(t[2:])
			if err != nil || (bits != 8 && bits != 16 && bits != 32 && bits != 64) {
				return ptxParam{}, false
			}
			p.kind = map[byte]paramKind{'u': paramInt, 's': paramInt, 'f': paramFloat, 'b': paramBits}[t[1]]
			p.size, p.typ = bits/8, t
		default:
			return ptxParam{}, false
		}
	}
	if p.kind == 0 {
		return ptxParam{}, false
	}
	name := f[len(f)-1]
	if open := strings.IndexByte(name, '['); open >= 0 {
		if !strings.HasSuffix(name, "]") {
			return ptxParam{}, false
		}
		n, err := strconv.Atoi(name[open+1 : len(name)-1])
		if err != nil || n <= 0 || n > 1<<16 {
			return ptxParam{}, false
		}
		p.size *= n
		p.typ += name[open:]
	}
	return p, true
}

// indexToken returns the index of tok in s where it stands as a whole word
// (not part of a longer name such as .entryx), or -1.
func indexToken(s, tok string) int {
	for off := 0; ; {
		i := strings.Index(s[off:], tok)
		if i < 0 {
			return -1
		}
		i += off
		end := i + len(tok)
		if (i == 0 || !isPTXIdent(s[i-1])) && (end == len(s) || !isPTXIdent(s[end])) {
			return i
		}
		off = end
	}
}

func isPTXIdent(c byte) bool {
	return c == '_' || c == '$' || c == '%' || c == '.' ||
		('0' <= c && c <= '9') || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

// stripPTXComments replaces // and /* */ comments with a space.
func stripPTXComments(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		switch {
		case strings.HasPrefix(s, "//"):
			if i := strings.IndexByte(s, '\n'); i >= 0 {
				s = s[i:]
			} else {
				s = ""
			}
			b.WriteByte(' ')
		case strings.HasPrefix(s, "/*"):
			if i := strings.Index(s[2:], "*/"); i >= 0 {
				s = s[i+4:]
			} else {
				s = ""
			}
			b.WriteByte(' ')
		default:
			b.WriteByte(s[0])
			s = s[1:]
		}
	}
	return b.String()
}

// checkArgs compares launch arguments with an entry's parameters.
func checkArgs(params []ptxParam, args []KernelArg) error {
	if len(args) != len(params) {
		return fmt.Errorf("%d arguments, the kernel has %d parameters", len(args), len(params))
	}
	for i, a := range args {
		p := params[i]
		if a.size != p.size || (p.kind != paramBits && a.kind != p.kind) {
			return fmt.Errorf("argument %d is %s, parameter %d is %s", i, a.kindName(), i, p.typ)
		}
	}
	return nil
}
