package sandbox

import "tine/gateway"

// boundSecrets returns the secrets bound to a sandbox's destinations.
func (m *Manager) boundSecrets(name string) []gateway.Secret { return nil }
