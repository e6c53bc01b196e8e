{{/*
Helpers of the Hearth chart.

The templates keep to a small subset of Helm's template language so that
deploy/helm/test_chart.py can render them without helm: `define`, `include`,
`if`/`else if`/`else`/`end`, variables (`$x := ...`), and the functions
toYaml, nindent, indent, quote, default, required, fail, printf, trunc,
trimSuffix, hasPrefix, replace, not, and, or, eq, ne, gt, empty, index,
lookup, randAlphaNum, b64enc, int and mul. No `with`, no `range`, no `tpl`.
Values are numbers as Helm reads them (float64): print an integer that may
reach 1e6 through `int` or `mul`, or it prints as 1e+06.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "hearth.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* "<release>-<name>", or fullnameOverride; the prefix of every resource name. */}}
{{- define "hearth.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "hearth.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{/* The helm.sh/chart label. */}}
{{- define "hearth.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "hearth.labels" -}}
helm.sh/chart: {{ include "hearth.chart" . }}
{{ include "hearth.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The labels shared by every selector of the release. */}}
{{- define "hearth.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hearth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Control plane: name, labels, selector labels, ServiceAccount. */}}
{{- define "hearth.controlName" -}}
{{- printf "%s-control" (include "hearth.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "hearth.controlLabels" -}}
{{ include "hearth.labels" . }}
app.kubernetes.io/component: control
{{- end }}

{{- define "hearth.controlSelectorLabels" -}}
{{ include "hearth.selectorLabels" . }}
app.kubernetes.io/component: control
{{- end }}

{{/* The address hosts (and in-cluster clients) reach the control plane at. */}}
{{- define "hearth.controlUrl" -}}
{{- printf "http://%s.%s.svc:%v" (include "hearth.controlName" .) .Release.Namespace .Values.control.service.port -}}
{{- end }}

{{/* HEARTH_PUBLIC_URL: publicUrl, or the in-cluster address. */}}
{{- define "hearth.publicUrl" -}}
{{- default (include "hearth.controlUrl" .) .Values.publicUrl -}}
{{- end }}

{{/* Sandbox hosts: name (of the Deployment too), labels, selector labels, ServiceAccount. */}}
{{- define "hearth.hostName" -}}
{{- printf "%s-host" (include "hearth.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "hearth.hostLabels" -}}
{{ include "hearth.labels" . }}
app.kubernetes.io/component: host
{{- end }}

{{- define "hearth.hostSelectorLabels" -}}
{{ include "hearth.selectorLabels" . }}
app.kubernetes.io/component: host
{{- end }}

{{/* The image both components run; the tag is required. */}}
{{- define "hearth.image" -}}
{{- printf "%s:%v" .Values.images.hearth.repository (required "images.hearth.tag is required (e.g. --set images.hearth.tag=0.1.0)" .Values.images.hearth.tag) -}}
{{- end }}

{{/*
Several control-plane replicas share their state through one PostgreSQL
database (placement, leases, signing keys, the autoscaler's lease): a
SQLite file would be one per pod. Refuse control.replicas > 1 unless the
database is external: database.existingSecret (which must hold a
postgres:// URL), or an inline postgres:// database.url. Checked wherever
the database is named, so every template that reads it fails the same way.
*/}}
{{- define "hearth.checkReplicasDatabase" -}}
{{- if gt (int .Values.control.replicas) 1 -}}
{{- if .Values.database.url -}}
{{- if not (or (hasPrefix "postgres://" .Values.database.url) (hasPrefix "postgresql://" .Values.database.url)) -}}
{{- fail "control.replicas > 1 needs PostgreSQL: database.url must be a postgres:// URL (replicas cannot share a SQLite file). Point it at PostgreSQL, or set control.replicas=1." -}}
{{- end -}}
{{- else if not .Values.database.existingSecret -}}
{{- fail "control.replicas > 1 needs an external PostgreSQL database: set database.existingSecret (a Secret holding a postgres:// URL) or database.url, or set control.replicas=1." -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The Secret and key holding the database URL. */}}
{{- define "hearth.databaseSecretName" -}}
{{- include "hearth.checkReplicasDatabase" . -}}
{{- if .Values.database.url -}}
{{- printf "%s-database" (include "hearth.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- required "database.existingSecret or database.url is required" .Values.database.existingSecret -}}
{{- end -}}
{{- end }}

{{- define "hearth.databaseSecretKey" -}}
{{- if .Values.database.url -}}
url
{{- else -}}
{{- required "database.existingSecretKey is required" .Values.database.existingSecretKey -}}
{{- end -}}
{{- end }}

{{/* The Secret and key holding the master key. */}}
{{- define "hearth.masterKeySecretName" -}}
{{- if .Values.masterKey.existingSecret -}}
{{- .Values.masterKey.existingSecret -}}
{{- else -}}
{{- printf "%s-master-key" (include "hearth.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "hearth.masterKeySecretKey" -}}
{{- if .Values.masterKey.existingSecret -}}
{{- required "masterKey.existingSecretKey is required" .Values.masterKey.existingSecretKey -}}
{{- else -}}
master.key
{{- end -}}
{{- end }}

{{/* Where the master key is mounted in every pod (both components). */}}
{{- define "hearth.masterKeyFile" -}}
/etc/hearth/master-key/master.key
{{- end }}

{{/* The Secret and key holding the hosts' enrollment token. */}}
{{- define "hearth.hostTokenSecretName" -}}
{{- if .Values.hostToken.existingSecret -}}
{{- .Values.hostToken.existingSecret -}}
{{- else -}}
{{- printf "%s-host-token" (include "hearth.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "hearth.hostTokenSecretKey" -}}
{{- if .Values.hostToken.existingSecret -}}
{{- required "hostToken.existingSecretKey is required" .Values.hostToken.existingSecretKey -}}
{{- else -}}
token
{{- end -}}
{{- end }}

{{/*
Environment both components share: the master key (the same file in every
pod), the enrollment token (the control plane accepts hosts that present
it; hosts register and drain with it) and the log filter. A list of
EnvVar, to be indented by the caller.
*/}}
{{- define "hearth.sharedEnv" -}}
- name: HEARTH_MASTER_KEY_FILE
  value: {{ include "hearth.masterKeyFile" . | quote }}
- name: HEARTH_HOST_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "hearth.hostTokenSecretName" . }}
      key: {{ include "hearth.hostTokenSecretKey" . }}
- name: HEARTH_LOG
  value: {{ .Values.logLevel | quote }}
{{- end }}

{{/*
The hosts' object store and its credentials (the control plane, run with
--no-local-host, never opens the store).
*/}}
{{- define "hearth.storeEnv" -}}
- name: HEARTH_STORE_URL
  value: {{ required "store.url is required: an S3 URL every host shares (e.g. s3://bucket/hearth?region=us-east-1)" .Values.store.url | quote }}
{{- if .Values.store.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.store.existingSecret }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.store.existingSecret }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- end }}

{{/*
The CPU a host offers placement, in millicores (HEARTH_HOST_CPU_MILLICORES):
sandboxHost.capacity.cpuMillicores, else 8 sandbox vCPUs per host vCPU
(what `hearth host serve` assumes of the cores it sees).
*/}}
{{- define "hearth.hostCpuMillicores" -}}
{{- if .Values.sandboxHost.capacity.cpuMillicores -}}
{{- int .Values.sandboxHost.capacity.cpuMillicores -}}
{{- else -}}
{{- mul .Values.sandboxHost.capacity.vcpus 8000 -}}
{{- end -}}
{{- end }}

{{/*
The control plane's data directory (--data-dir): it creates its signing key,
control.key, there on first start, so the directory must be writable.
*/}}
{{- define "hearth.controlDataDir" -}}
/var/lib/hearth
{{- end }}

{{/*
The master key volume: the Secret's one key as the file master.key, mode
0400 (hearth refuses a key file group or others can read; no fsGroup).
*/}}
{{- define "hearth.masterKeyVolume" -}}
- name: master-key
  secret:
    secretName: {{ include "hearth.masterKeySecretName" . }}
    defaultMode: 256
    items:
      - key: {{ include "hearth.masterKeySecretKey" . }}
        path: master.key
{{- end }}

{{- define "hearth.masterKeyMount" -}}
- name: master-key
  mountPath: /etc/hearth/master-key
  readOnly: true
{{- end }}
