{{/* The service's resource name: <release>-ratelimit unless fullnameOverride. */}}
{{- define "tollgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-ratelimit" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: tollgate-ratelimit
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tollgate.labels" -}}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tollgate
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The sync Service's FQDN: what Istio names the gateways' outbound cluster after. */}}
{{- define "tollgate.syncHost" -}}
{{- printf "%s.%s.svc.%s" (include "tollgate.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* True when gateways authenticate by Istio mTLS (istio.enabled): the service then runs with --insecure behind an AuthorizationPolicy, and secrets.sync is not used (a WasmPlugin cannot reference a Secret). */}}
{{- define "tollgate.mtlsAuth" -}}
{{- if .Values.istio.enabled -}}
true
{{- else if not .Values.secrets.sync.secretName -}}
{{- fail "secrets.sync.secretName is required: the name of an existing Secret holding the sync secret (with istio.enabled, gateways authenticate by mTLS instead)" -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tollgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Checks on the Redis values, named after the value to fix. */}}
{{- define "tollgate.checkRedis" -}}
{{- $r := .Values.redis -}}
{{- if not (has $r.mode (list "standalone" "cluster" "sentinel")) -}}
{{- fail (printf "redis.mode %q: want standalone, cluster or sentinel" $r.mode) -}}
{{- end -}}
{{- if not $r.addrs -}}
{{- fail "redis.addrs: at least one host:port" -}}
{{- end -}}
{{- if and (eq $r.mode "standalone") (gt (len $r.addrs) 1) -}}
{{- fail "redis.addrs: standalone mode takes one address" -}}
{{- end -}}
{{- if and (eq $r.mode "sentinel") (not $r.masterName) -}}
{{- fail "redis.masterName is required in sentinel mode" -}}
{{- end -}}
{{- if and $r.tls.clientCertSecret.secretName (not $r.tls.enabled) -}}
{{- fail "redis.tls.clientCertSecret needs redis.tls.enabled" -}}
{{- end -}}
{{- end -}}

{{/* --policy-store's value: policyStore.url with the mounted password file as its passfile parameter (pgx reads it; no password sits in the URL, the pod spec or an environment value). Refuses a URL that carries a password itself. */}}
{{- define "tollgate.policyStore" -}}
{{- $p := .Values.policyStore -}}
{{- $u := urlParse $p.url -}}
{{- if contains ":" $u.userinfo -}}
{{- fail "policyStore.url: carries a password; put it in the Secret named by policyStore.passfile" -}}
{{- end -}}
{{- range $kv := splitList "&" $u.query -}}
{{- $k := regexReplaceAll "=.*" $kv "" -}}
{{- if has $k (list "password" "passfile") -}}
{{- fail (printf "policyStore.url: its %s parameter: the password goes in the Secret named by policyStore.passfile" $k) -}}
{{- end -}}
{{- end -}}
{{- $p.url -}}
{{- if $p.passfile.secretName -}}
{{- if $u.query }}&{{ else }}?{{ end }}passfile=/etc/tollgate/secrets/pgpass
{{- end -}}
{{- end -}}

{{/* The gateways' proxy config for per-rule stats: keep the filter's stats (Envoy names them wasmcustom.…tollgate…) and turn the rule=.=<id>;.; in a per-rule stat's name into the label rule. Bootstrap settings: Istio takes them only from meshConfig.defaultConfig or the pod's proxy.istio.io/config annotation (the ProxyConfig resource has no such fields). */}}
{{- define "tollgate.gatewayProxyConfig" -}}
{{- dict "proxyStatsMatcher" (dict "inclusionRegexps" (list ".*tollgate.*")) "extraStatTags" (list "rule") | toYaml -}}
{{- end -}}
