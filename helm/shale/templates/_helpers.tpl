{{/* Names and labels shared by every template. */}}

{{- define "shale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name; every object name starts with it (at most 40 characters, so that "<fullname>-storage" stays a valid StatefulSet name). */}}
{{- define "shale.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "shale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "shale.labels" -}}
helm.sh/chart: {{ include "shale.chart" . }}
{{ include "shale.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shale
{{- end -}}

{{- define "shale.operatorName" -}}{{ include "shale.fullname" . }}-operator{{- end -}}
{{- define "shale.storageName" -}}{{ include "shale.fullname" . }}-storage{{- end -}}
{{- define "shale.headlessName" -}}{{ include "shale.fullname" . }}-storage-headless{{- end -}}
{{/* The bootstrap Service clients connect to: <fullname>.<namespace>.svc:<kafkaPort>. */}}
{{- define "shale.clientServiceName" -}}{{ include "shale.fullname" . }}{{- end -}}

{{/* The storage pods' ServiceAccount (their Lease rights with replication; templates/rbac-storage.yaml). */}}
{{- define "shale.storageServiceAccountName" -}}
{{- if .Values.storage.serviceAccount.create -}}
{{- default (include "shale.storageName" .) .Values.storage.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.storage.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The replication factor the operator gives a Topic without spec.replicas: 1 without replication. */}}
{{- define "shale.defaultReplicas" -}}
{{- ternary .Values.operator.defaultReplicas 1 .Values.storage.replication.enabled -}}
{{- end -}}

{{- define "shale.topicsConfigMap" -}}
{{- default (printf "%s-topics" (include "shale.fullname" .)) .Values.storage.topicsConfigMap -}}
{{- end -}}

{{- define "shale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shale.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "shale.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.registry -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Namespaces whose Topics the operator reconciles: watchNamespaces, or the release namespace. */}}
{{- define "shale.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- join "," .Values.operator.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The advertised-host suffix after the pod name: .<headless>.<namespace>.svc[.<clusterDomain>] */}}
{{- define "shale.podDomain" -}}
{{- printf ".%s.%s.svc" (include "shale.headlessName" .) .Release.Namespace -}}
{{- with .Values.storage.clusterDomain -}}.{{ . }}{{- end -}}
{{- end -}}

{{/* The operator's rules on Topics, in each namespace it reconciles (templates/rbac.yaml). */}}
{{- define "shale.topicRules" }}
  # Watch Topics (kopf lists and watches; it never reads one by name), and patch them: kopf's finalizer
  # and its annotations (last handled spec, progress). No topics/finalizers: that subresource guards
  # ownerReferences (OwnerReferencesPermissionEnforcement), which the operator never sets.
  - apiGroups: ["shale.dev"]
    resources: ["topics"]
    verbs: ["list", "watch", "patch"]
  # Write status (observedGeneration, conditions, partitions, diskUsageBytes) through the subresource.
  - apiGroups: ["shale.dev"]
    resources: ["topics/status"]
    verbs: ["patch"]
  # Post Events about a Topic: a spec it cannot apply (InvalidConfig, ...), a handler that failed.
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create"]
{{- end }}
