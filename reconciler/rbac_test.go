package reconciler_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestAgentRBACLeasesOnlyInItsNamespace: the agent's rights over Leases
// (for leader election) are a Role in its own namespace. A ClusterRole
// granting them would let it rewrite kube-system's and kube-node-lease's
// Leases: node heartbeats and every controller's election.
func TestAgentRBACLeasesOnlyInItsNamespace(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "deploy", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	grantsLeases := func(rules []rbacv1.PolicyRule) []string {
		var verbs []string
		for _, r := range rules {
			if slices.Contains(r.APIGroups, "coordination.k8s.io") || slices.Contains(r.APIGroups, "*") {
				if slices.Contains(r.Resources, "leases") || slices.Contains(r.Resources, "*") {
					verbs = append(verbs, r.Verbs...)
				}
			}
		}
		slices.Sort(verbs)
		return verbs
	}
	var roleVerbs []string
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta struct {
			metav1.TypeMeta `json:",inline"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "ClusterRole":
			role := &rbacv1.ClusterRole{}
			if err := yaml.UnmarshalStrict([]byte(doc), role); err != nil {
				t.Fatal(err)
			}
			if v := grantsLeases(role.Rules); len(v) > 0 {
				t.Errorf("ClusterRole %s grants %v on leases in every namespace", role.Name, v)
			}
		case "Role":
			role := &rbacv1.Role{}
			if err := yaml.UnmarshalStrict([]byte(doc), role); err != nil {
				t.Fatal(err)
			}
			if role.Namespace != "berth-system" {
				t.Errorf("Role %s in namespace %q, want berth-system", role.Name, role.Namespace)
			}
			roleVerbs = append(roleVerbs, grantsLeases(role.Rules)...)
		}
	}
	if want := []string{"create", "get", "update"}; !slices.Equal(roleVerbs, want) {
		t.Errorf("the agent's Role grants %v on leases, want %v (what leader election uses)", roleVerbs, want)
	}
}
