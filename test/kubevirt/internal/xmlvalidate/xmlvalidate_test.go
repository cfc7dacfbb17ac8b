package xmlvalidate

import (
	"context"
	"strings"
	"testing"
)

func TestStripKubeVirtEmptiesOnlyRemovesEmpties(t *testing.T) {
	t.Parallel()
	in := "<sysinfo type=\"smbios\">\n\t<system><entry name=\"uuid\">x</entry></system>\n\t<bios></bios>\n\t<baseBoard/>\n\t<chassis>\n\t</chassis>\n" +
		"\t<bios><entry name=\"vendor\">v</entry></bios>\n</sysinfo>"
	got := string(StripKubeVirtEmpties([]byte(in)))
	want := "<sysinfo type=\"smbios\">\n\t<system><entry name=\"uuid\">x</entry></system>\n" +
		"\t<bios><entry name=\"vendor\">v</entry></bios>\n</sysinfo>"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestDomainRejectsInvalid(t *testing.T) {
	t.Parallel()
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	err := Domain(context.Background(), []byte(`<domain type="kvm"><bogus/></domain>`))
	if err == nil || !strings.Contains(err.Error(), "virt-xml-validate") {
		t.Fatalf("invalid domain accepted: %v", err)
	}
}
